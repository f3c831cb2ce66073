"""Config files and prepared directories that are wrong in ways that used to pass silently or
end in a traceback: duplicate YAML keys, out-of-range seeds, a directory as a file, a corrupt
sentencepiece model or manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from data.test_bad_input_prepare import config, corpus, lines

from xinda.config import load_config
from xinda.data.manifest import load_manifest, load_vocabularies
from xinda.data.prepare import prepare
from xinda.errors import XindaError
from xinda.models.registry import resolve

# the model section of a trained model's config.yaml: every field
TINY_FIELDS = resolve({"preset": "transformer-tiny"}).model_dump(mode="json")


def error(call, *args) -> str:
    with pytest.raises(XindaError) as info:
        call(*args)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_key_given_twice_is_refused_with_its_line(tmp_path):
    """Before: the second ``data:`` silently replaced the first."""
    path = tmp_path / "config.yaml"
    path.write_text("data:\n  vocab_size: 16\n  train: corpus\ntrain:\n  lr: 0.001\n"
                    "data:\n  vocab_size: 32\n")
    assert error(load_config, path) == f"{path}: invalid YAML: duplicate key 'data' at line 6"
    path.write_text("train:\n  lr: 0.001\n  warmup_steps: 10\n  lr: 0.002\n")
    assert "duplicate key 'lr' at line 4" in error(load_config, path)
    path.write_text("train:\n  lr: 0.001\n? [a, b]\n: 1\n")  # before: no line (a TypeError)
    assert "line 3" in error(load_config, path)


def test_a_key_yaml_reads_as_a_boolean_is_named_as_read(tmp_path):
    """Before: "train.0: Keys should be strings", a key never written (found by review)."""
    path = tmp_path / "config.yaml"
    path.write_text("train:\n  off: 1\n")
    assert error(load_config, path) == (f"{path}: train.False: Keys should be strings (YAML "
                                        "reads yes/no/on/off unquoted as False: quote the key)")


@pytest.mark.parametrize("value", ["runs/exp #1", "#x", "runs/exp  # the first"])
def test_a_comment_in_a_set_value_is_refused(value):
    """Before: 'runs/exp #1' silently became runs/exp, another run's folder (found by
    review); quoted, or with '#' inside a word, it is kept."""
    assert "quote the value" in error(load_config, None, [f"train.out_dir={value}"])
    assert load_config(None, [f"train.out_dir='{value}'"]).train.out_dir == value
    assert load_config(None, ["train.out_dir=a#b"]).train.out_dir == "a#b"


def test_a_set_of_a_whole_section_is_named_in_its_section_s_errors(tmp_path):
    """Before: "s.yaml: train: min_lr ..." blamed a file that is valid alone (found by
    review)."""
    path = tmp_path / "s.yaml"
    path.write_text("train: {lr: 0.001}\n")
    assert error(load_config, path, ["train={lr: 0.001, min_lr: 0.01}"]).startswith(
        f"{path} with --set train={{lr: 0.001, min_lr: 0.01}}: train: min_lr 0.01 is above")


def test_a_set_reaches_one_section_even_where_a_yaml_alias_shares_it(tmp_path):
    """Before: --set train.seed=5 changed data.seed too (found by review)."""
    path = tmp_path / "config.yaml"
    path.write_text("data: &common {seed: 3}\ntrain: *common\n")
    cfg = load_config(path, ["train.seed=5"])
    assert (cfg.data.seed, cfg.train.seed) == (3, 5)


@pytest.mark.parametrize(("key", "value", "top"), [
    ("data.seed", -1, 2**32 - 1), ("data.seed", 2**32, 2**32 - 1),  # sentencepiece's uint32
    ("train.seed", -1, 2**32 - 1), ("train.seed", 2**32, 2**32 - 1),  # numpy's
    ("decode.seed", -1, 2**63 - 1), ("decode.seed", 2**63, 2**63 - 1)])  # torch.Generator's
def test_seeds_outside_what_their_generator_takes_are_refused(key, value, top):
    """Before: data.seed=-1 crashed sentencepiece with a traceback after reading the corpus."""
    assert f"{key}: Input should be" in error(load_config, None, [f"{key}={value}"])
    section = getattr(load_config(None, [f"{key}={top}"]), key.split(".")[0])
    assert section.seed == top


def test_a_directory_as_the_config_or_the_sentencepiece_model(tmp_path):
    assert error(load_config, tmp_path) == f"{tmp_path}: is a directory, not a config file"
    train = corpus(tmp_path, "train", lines(50), lines(50, 1))
    message = error(prepare, config(tmp_path, train=train, spm_model=str(tmp_path)))
    assert message.startswith(f"{tmp_path}: is a directory")


@pytest.mark.parametrize("content", [b"", b"\x1a\x00", b"not a model"])
def test_a_bad_sentencepiece_model_is_refused_before_the_corpus_is_read(tmp_path, content):
    """Before: an empty file passed the check and crashed later with a traceback, and any
    bad model was only looked at after a pass over the whole training corpus."""
    model = tmp_path / "spm.model"
    model.write_bytes(content)
    short = corpus(tmp_path, "train", lines(50), lines(49, 1))  # misaligned: read, it fails
    message = error(prepare, config(tmp_path, train=short, spm_model=str(model)))
    assert message == f"{model}: not a valid sentencepiece model (data.spm_model)"
    assert not (tmp_path / "bin").exists()


def test_a_character_coverage_sentencepiece_refuses_is_a_config_error():
    """Before: accepted, and sentencepiece refused it after a pass over the whole corpus."""
    assert "data.character_coverage: Input should be greater than or equal to 0.98" in error(
        load_config, None, ["data.character_coverage=0.9"])
    assert load_config(None, ["data.character_coverage=0.9995"]).data.character_coverage == 0.9995


def test_a_coverage_penalty_for_a_model_without_attention_is_refused_before_training():
    """Before: accepted; the first validation BLEU raised the error, after a whole epoch of
    training and before its checkpoint was saved."""
    from xinda.cli import validated

    rnn = ["model.arch=rnn", "decode.coverage=0.2"]
    message = error(validated, load_config(None, [*rnn, "model.attention=none"]), "run.yaml")
    assert message == ("run.yaml: decode.coverage: the coverage penalty needs a model that "
                       "attends to the source; this one has model.attention none")
    assert validated(load_config(None, rnn), "run.yaml").decode.coverage == 0.2


@pytest.mark.parametrize(("key", "value", "message"), [
    ("train.eps", 0, "greater than 0"),  # before: NaN weights at update 1, "lower train.lr"
    ("train.valid_beam", 1001, "less than or equal to 1000"),  # before: after a whole epoch
    ("train.dist_timeout", 1e15, "less than or equal to"),  # before: a timedelta traceback
    # before: a sentencepiece traceback once the corpus was read (found by review)
    ("data.vocab_size", 2**31, "less than 2147483648"),
    ("decode.alpha", 10.5, "less than or equal to 10"),  # before: OverflowError on long outputs
])
def test_training_settings_that_would_fail_later_are_refused_at_once(key, value, message):
    assert f"{key}: Input should be {message}" in error(load_config, None, [f"{key}={value}"])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("prepared")
    prepare(config(root, train=corpus(root, "train", lines(200), lines(200, 1))),
            log=lambda _: None)
    return root / "bin"


def test_a_truncated_sentencepiece_model_is_named(prepared, tmp_path):
    broken = shutil.copytree(prepared, tmp_path / "bin")
    model = broken / "spm.model"
    model.write_bytes(model.read_bytes()[:100])
    assert error(load_vocabularies, broken) == (
        f"{model}: not a valid sentencepiece model — run xinda prepare again")


@pytest.mark.parametrize("manifest", [[1, 2], {"format_version": 1}, "text"])
def test_a_manifest_of_the_wrong_shape_is_named(prepared, tmp_path, manifest):
    broken = shutil.copytree(prepared, tmp_path / "bin")
    (broken / "manifest.json").write_text(json.dumps(manifest))
    assert error(load_manifest, broken).startswith(
        f"{broken / 'manifest.json'}: not a manifest of xinda prepare (no spm")


@pytest.mark.parametrize(("setting", "named"), [
    ("train.betas=[1.5,0.98]", "train.betas.0"), ("train.eps=-1", "train.eps"),
    ("train.weight_decay=-0.1", "train.weight_decay"), ("train.momentum=-0.5", "train.momentum"),
    ("train.momentum=1.5", "train.momentum"),
    ("train.lr=.inf", "train.lr"), ("train.dist_timeout=.inf", "train.dist_timeout"),
    ("train.min_lr=-1", "train.min_lr"), ("train.warmup_steps=0", "warmup_steps >= 1")])
def test_optimizer_settings_torch_would_refuse_are_config_errors(setting, named):
    """Before: accepted, then a torch ValueError traceback at the first update (or, lr inf,
    a NaN loss; warm-up 0 made inverse_sqrt a constant rate without a word)."""
    assert named in error(load_config, None, [setting])


def test_an_eps_that_is_0_in_float32_is_refused():
    """Before: eps 1e-300 was accepted, became 0 in the optimizer's float32 and gave a NaN loss,
    reported as "lower train.lr"."""
    assert error(load_config, None, ["train.eps=1e-300"]) == (
        "--set train.eps=1e-300: train.eps: 1e-300 is below float32's smallest normal number "
        "1.18e-38: 0 in the optimizer's float32, a NaN loss")
    assert load_config(None, ["train.eps=1.2e-38"]).train.eps == 1.2e-38


def test_a_cuda_device_without_cuda_is_one_line(monkeypatch):
    """Before: AssertionError "Torch not compiled with CUDA enabled" (a traceback)."""
    from xinda.device import pick_device
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert error(pick_device, "cuda").startswith("train.device cuda: no CUDA device here")


def test_a_position_table_beyond_max_length_is_a_config_error():
    """Before: accepted; building the model asked for a 256 GB sinusoidal table (a traceback)."""
    from xinda.cli import validated

    big = ["model.arch=transformer", "model.max_positions=2000000000"]
    message = error(validated, load_config(None, big), "c.yaml")
    assert message == "c.yaml: model.max_positions: Input should be less than or equal to 1000000"
    top = load_config(None, ["model.preset=transformer-base", "model.max_positions=1000000"])
    assert validated(top, "c.yaml").model["max_positions"] == 1_000_000


def test_heads_that_do_not_divide_the_width_are_a_config_error():
    """Before: accepted by the config, then a ValueError traceback when the model was built."""
    from xinda.models.registry import resolve
    message = error(resolve, {"preset": "transformer-tiny", "heads": 3}, "c.yaml")
    assert "heads (3) must divide d_model (128)" in message


@pytest.mark.parametrize(("text", "message"), [
    ("data:\n\ttrain: c\n", "line 2, column 1: found character '\\t' that cannot start any token"),
    ("data:\n  train: c\n valid: v\n",
     "line 3, column 2: expected <block end>, but found '<block mapping start>'"),
    ("data: [\n", "line 2, column 1: expected the node content, but found '<stream end>'"),
])
def test_invalid_yaml_names_its_line_and_the_problem(tmp_path, text, message):
    """Before: only PyYAML's context line came out ("while scanning for the next token"),
    without the problem or its line (found by review)."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert error(load_config, path) == f"{path}: invalid YAML: {message}"


def test_yaml_merge_keys_are_read_and_may_be_given_again(tmp_path):
    """Before: "could not determine a constructor for the tag 'tag:yaml.org,2002:merge'"."""
    path = tmp_path / "config.yaml"
    path.write_text("data:\n  <<: &pair {src_lang: zh, tgt_lang: en}\n  tgt_lang: ja\n"
                    "decode:\n  <<: {beam: 3}\n")
    cfg = load_config(path)
    assert (cfg.data.src_lang, cfg.data.tgt_lang, cfg.decode.beam) == ("zh", "ja", 3)
    path.write_text("data:\n  <<: {src_lang: zh}\n  train: a\n  train: b\n")
    assert "duplicate key 'train' at line 4" in error(load_config, path)


@pytest.mark.parametrize(("overrides", "message"), [
    (["data.tgt_lang=en"], ("data: src_lang and tgt_lang are both 'en': both sides would be "
                            "read from the same files ({split}.en)")),
    (["data.out_dir=''"], "data.out_dir: String should have at least 1 character"),
    (["train.out_dir=''"], "train.out_dir: String should have at least 1 character"),
    (["train.lr=1e-4", "train.min_lr=1e-3"], ("train: min_lr 0.001 is above the peak lr "
                                              "0.0001: the rate would jump up after the warm-up")),
    (["data.src_lang=''"], "data.src_lang: String should have at least 1 character"),
    (["data.src_lang=no"], ("data.src_lang: Input should be a valid string (YAML reads "
                            "yes/no/on/off unquoted as False: quote the value)")),
    (["train.threads=1025"], "train.threads: Input should be less than or equal to 1024"),
    (["data.workers=100000000"], "data.workers: Input should be less than or equal to 1024"),
    # booleans: pydantic's lax mode read them as 1 and 0
    (["train.max_epochs=yes"], ("train.max_epochs: expected a number, got the boolean True "
                                "(YAML reads yes/no/on/off/true/false unquoted as booleans)")),
    (["train.betas=[0.9, off]"], ("train.betas: expected a number, got the boolean False "
                                  "(YAML reads yes/no/on/off/true/false unquoted as booleans)")),
    (["decode.beam=on"], ("decode.beam: expected a number, got the boolean True "
                          "(YAML reads yes/no/on/off/true/false unquoted as booleans)")),
    # another optimizer's or schedule's settings were silently ignored
    (["train.momentum=0.9"], "train: momentum applies only with optimizer sgd (it is adam)"),
    (["train.optimizer=sgd", "train.eps=1e-6"],
     "train: eps applies only with optimizer adam (it is sgd)"),
    (["train.decay_every=10"],
     "train: decay_every applies only with schedule step (it is inverse_sqrt)"),
    (["data.pretok_src=jieba", "data.moses_lang_src=en"],  # found by review
     "data: moses_lang_src applies only with pretok_src moses (it is jieba)"),
])
def test_settings_that_cannot_work_are_refused(overrides, message):
    """Found by review: an empty out_dir wrote the dataset into the current folder, the same
    language on both sides read one file as source and target, and 50000 threads segfaulted."""
    assert error(load_config, None, overrides) == f"--set {' '.join(overrides)}: {message}"


def test_sentencepiece_training_settings_with_a_given_model_are_named():
    """Before: data.joint_vocab false and data.vocab_size 5000 with data.spm_model were silently
    ignored (the manifest said joint). prepare warns (tests/data: test_spm_model_reuse), not an
    error: recipes' settings go with a reused model too."""
    def unused(*overrides: str) -> list[str]:
        return list(load_config(None, list(overrides)).data.unused_spm_settings())

    reuse = "data.spm_model=model/spm.model"
    assert unused(reuse, "data.joint_vocab=true", "data.vocab_size=8000") == []  # defaults
    assert unused("data.joint_vocab=false", "data.vocab_size=5000") == []  # no spm_model
    assert unused(reuse, "data.joint_vocab=false", "data.vocab_size=5000",
                  "data.subword=unigram", "data.character_coverage=0.9995",
                  "data.spm_sample=10") == [
        f"data.{setting} has no effect with data.spm_model: the given sentencepiece model is "
        "used as it is, for both sides" for setting in (
            "character_coverage 0.9995", "joint_vocab False", "spm_sample 10",
            "subword unigram", "vocab_size 5000")]


def test_a_section_left_empty_keeps_its_defaults(tmp_path):
    """Before: "data: Input should be a valid dictionary", and with --set "'data' is not a
    section"."""
    path = tmp_path / "config.yaml"
    path.write_text("data:\n  # train: corpus\ndecode:\n")
    cfg = load_config(path)
    assert cfg.data.src_lang == "en" and cfg.decode.beam == 5
    assert load_config(path, ["data.train=corpus"]).data.train == "corpus"


def test_too_many_threads_is_one_line_not_a_crash():
    from xinda.device import set_threads

    assert "--threads must be 0 (torch's default) to 1024, got 50000" in error(set_threads, 50000)
    assert "got -1" in error(set_threads, -1)


@pytest.mark.parametrize(("spec", "message"), [
    ({"preset": ["transformer-tiny"]}, "model.preset: unknown preset ['transformer-tiny']"),
    ({"arch": {"a": 1}}, "model.arch: unknown architecture {'a': 1}"),
    ({"preset": "transformer-tiny", "arch": "rnn"},
     "model.arch: 'rnn' conflicts with preset 'transformer-tiny', a transformer model"),
    # a preset set over a trained model's config.yaml (every field): the fields won, silently
    ({**TINY_FIELDS, "preset": "transformer-big"},
     "model: preset 'transformer-big' beside every field"),
    ({"arch": "rnn", "embed_dim": True}, "model.embed_dim: expected a number, got the boolean"),
])
def test_model_specs_of_the_wrong_shape_are_one_line(spec, message):
    """Before: "unhashable type" tracebacks, "model.d_model: Extra inputs are not permitted"
    for a key the user never wrote, and embed_dim true read as 1."""
    assert error(resolve, spec).startswith(message)


def test_a_preset_with_arch_and_some_fields_still_resolves():
    """Older model folders saved specs like this one (the fields override the preset's)."""
    spec = {"preset": "transformer-tiny", "arch": "transformer", "dropout": 0.3}
    assert resolve(spec).dropout == 0.3 and resolve(spec).d_model == TINY_FIELDS["d_model"]


@pytest.mark.parametrize(("call", "message"), [
    (lambda: load_config(5), "config: expected a file path, got int"),
    (lambda: load_config(None, [5]), "overrides: expected KEY=VALUE strings, got 5"),
    (lambda: __import__("xinda").Translator.load(None), "model_dir: expected a folder, got"),
])
def test_python_api_arguments_of_the_wrong_type_are_one_line_errors(call, message):
    """Before: TypeErrors from deep inside (found by review); XindaError is importable from
    the package itself."""
    from xinda import XindaError as exported

    assert exported is XindaError
    with pytest.raises(XindaError, match=f"^{message}"):
        call()


def test_load_config_takes_any_path_like(tmp_path):
    class PathLike:  # as pytest's tmpdir, or a custom __fspath__
        def __fspath__(self):
            return str(tmp_path / "c.yaml")

    (tmp_path / "c.yaml").write_text("train:\n  lr: 0.5\n")
    assert load_config(PathLike()).train.lr == 0.5


def test_a_trainer_given_a_path_instead_of_a_config_is_one_line(tmp_path):
    """Before: AttributeError: 'str' object has no attribute 'train' (found by review)."""
    from xinda.train.trainer import Trainer

    with pytest.raises(XindaError, match=r"^expected an ExperimentConfig \(xinda.config.load_"
                                         r"config\(path\)\), got str"):
        Trainer("config.yaml")
