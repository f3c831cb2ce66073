"""The textbook's applications of the encoder-decoder, trained and measured: couplets, poems,
classical <-> modern Chinese, e-mail subject lines (summarisation) and medical QA.

    python benchmarks/applications.py [--apps couplet,poetry,...] [--budget S] [--workdir DIR]

For each application: prepare and train ``recipes/{app}.yaml`` for its own ``train.max_seconds``
(or ``--budget`` seconds; a finished run in the work folder is reused), then decode and score
its test sets. Couplets and poems first get their corpus written from ../shared/data
(``python -m xinda.apps``) and are decoded twice, with plain beam search and with the
application's rules as decoding constraints (``xinda.apps.generate``), scored by
``xinda.evaluate.generation`` (character BLEU with its sacreBLEU signature). The other apps
read ../shared/data as it is and are scored by ``text_apps.py``. Writes
``docs/results/applications.{json,md}``. Not a test: it takes the budgets plus minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multi30k import (
    ROOT,
    SHARED,
    add_study_arguments,
    code_version,
    markdown_table,
    prepare_once,
    same_recipe,
    timed,
    write_run_config,
)
from text_apps import TEXT_APPS
from text_apps import evaluate as evaluate_text

from xinda.apps.generate import PoemPrompt, write_couplets, write_poems
from xinda.apps.poetry import FORMS
from xinda.apps.rules import CharacterTable
from xinda.config import apply_overrides
from xinda.decode.translator import Translator
from xinda.evaluate import generation as gen
from xinda.evaluate.metrics import corpus_scores
from xinda.utils import read_lines

APPS = {"couplet": {"tests": ("test", "wb14123"), "src": "up", "tgt": "down",
                    "data": ("poetry-couplets", "couplet")},
        "poetry": {"tests": ("test",), "src": "kw", "tgt": "poem", "data": ("poetry-quatrains",)},
        **{app: {"tests": ("test",), "data": (folder,)} for app, (folder, _) in TEXT_APPS.items()}}
RECIPE_DATA = "../shared/data/"  # how the text apps' recipes name the shared data folder


def data_path(app: str, workdir: Path, path: str) -> str:
    """Where a recipe's corpus prefix lies for this run: the written corpus under ``workdir``
    (couplets, poems) or the shared data folder (``$XINDA_SHARED_DATA``)."""
    if app in TEXT_APPS:
        return str(SHARED / path.removeprefix(RECIPE_DATA))
    return str(workdir / "raw" / Path(path).name)


def run_config(app: str, workdir: Path, args) -> dict:
    """recipes/{app}.yaml with its paths under ``workdir`` (``--budget``: this budget)."""
    cfg = yaml.safe_load((ROOT / "recipes" / f"{app}.yaml").read_text(encoding="utf-8"))
    data = cfg["data"]
    for key in ("train", "valid"):
        data[key] = data_path(app, workdir, data[key])
    data["test"] = {name: data_path(app, workdir, path) for name, path in data["test"].items()}
    data["out_dir"] = str(workdir / "data-bin")
    cfg["train"].update(out_dir=str(workdir / "model"), threads=args.threads, progress=False)
    if args.budget:
        cfg["train"]["max_seconds"] = args.budget
    return apply_overrides(cfg, args.overrides)


def train(app: str, workdir: Path, args) -> tuple[dict, dict]:
    """Corpus, prepare, train (each skipped when its output exists: a model trained with
    another recipe is refused, not reported under this one); the training stats and the
    run's config."""
    workdir.mkdir(parents=True, exist_ok=True)  # (the corpus log is the first file in it)
    if app not in TEXT_APPS and not (workdir / "raw" / f"train.{APPS[app]['src']}").exists():
        timed([sys.executable, "-m", "xinda.apps", app, str(SHARED), str(workdir / "raw")],
              workdir / "corpus.log")
    cfg, stats = run_config(app, workdir, args), workdir / "model" / "train_stats.json"
    trained_with = workdir / "config.yaml"  # (written below: the config the model had)
    if stats.exists() and not (trained_with.exists()
                               and same_recipe(yaml.safe_load(trained_with.read_text()), cfg)):
        sys.exit(f"{app}: {workdir / 'model'} was trained with another config than "
                 f"recipes/{app}.yaml now gives: delete {workdir}, or use another --workdir")
    prepare_once(cfg, workdir, f"{app}: ")
    cfg_path = write_run_config(workdir, cfg)
    if not stats.exists():
        timed([sys.executable, "-m", "xinda.cli", "train", str(cfg_path)],
              workdir / "train.log")
    return json.loads(stats.read_text()), cfg


def scores(hyps: list[str], refs: list[str]) -> dict:
    bleu = corpus_scores(hyps, refs, metrics=("bleu",), tokenize="char")[0]
    return {"bleu_char": round(bleu.score, 2), "signature": bleu.signature,
            "distinct_1": round(gen.distinct_n(hyps, 1), 3),
            "distinct_2": round(gen.distinct_n(hyps, 2), 3)}


def couplet_scores(ups: list[str], downs: list[str], refs: list[str], failed: int) -> dict:
    tone = gen.tone_rule_rate(ups, downs)
    return {**scores(downs, refs), "length_match": round(gen.length_match(ups, downs), 2),
            "pattern_match": round(gen.pattern_match(ups, downs), 2),
            "tone_rule": round(tone.rate, 2), "tone_rule_over": tone.count,
            "copy_rate": round(gen.same_position_copy_rate(ups, downs), 2), "failed": failed}


def evaluate_couplets(model_dir: Path, raw: Path, split: str, limit: int = 0) -> dict:
    ups = ["".join(x.split()) for x in read_lines(raw / f"{split}.up")][:limit or None]
    refs = ["".join(x.split()) for x in read_lines(raw / f"{split}.down")][:limit or None]
    translator = Translator.load(model_dir)
    plain = [t.replace(" ", "") for t in translator.translate_text(ups, beam=5)]
    result = {"sentences": len(ups), "reference": couplet_scores(ups, refs, refs, 0),
              "beam": couplet_scores(ups, plain, refs, 0)}
    for name, tone in (("constrained", False), ("constrained+tone", True)):
        ruled = [nbest[0] for nbest in write_couplets(translator, ups, tone=tone, beam=5)]
        result[name] = couplet_scores(ups, [o.text for o in ruled], refs,
                                      sum(o.error is not None for o in ruled))
    return result


def prompts(raw: Path, split: str, limit: int = 0) -> tuple[list[PoemPrompt], list[str]]:
    """The test prompts (form word + keywords) and the real poems."""
    forms = {word: form for form, word in FORMS.items()}
    out = []
    for line in read_lines(raw / f"{split}.kw"):
        word, *keywords = line.split()
        out.append(PoemPrompt(tuple(keywords), forms[word]))
    return out[:limit or None], list(read_lines(raw / f"{split}.poem"))[:limit or None]


def poem_scores(prompts_: list[PoemPrompt], poems: list[str], refs: list[str],
                failed: int) -> dict:
    ok = [gen.poem_layout_ok(p, q.form, len(q.acrostic) or 4, q.acrostic)
          for p, q in zip(poems, prompts_)]
    return {**scores(poems, refs), "layout_ok": round(100 * sum(ok) / len(ok), 2),
            "rhyme": round(gen.rhyme_rate(poems), 2), "failed": failed}


def evaluate_poems(model_dir: Path, raw: Path, split: str, limit: int = 0) -> dict:
    asked, refs = prompts(raw, split, limit)
    translator = Translator.load(model_dir)
    result = {"sentences": len(asked), "reference": poem_scores(asked, refs, refs, 0)}
    sources = [" ".join([FORMS[p.form], *p.keywords]) for p in asked]
    plain = translator.translate_text(sources, beam=5)
    result["beam"] = poem_scores(asked, [t.replace(" ", "") for t in plain], refs, 0)
    # acrostic: the first characters of the real poem's lines (those the model can write)
    table = CharacterTable.of(translator.tgt_vocab)
    heads = ["".join(line[0] for line in gen.poem_lines(r)) for r in refs]
    keep = [i for i, h in enumerate(heads) if all(map(table.writable, h))]
    acrostics = [PoemPrompt(asked[i].keywords, asked[i].form, heads[i]) for i in keep]
    for name, batch, gold, rhyme in (("constrained", asked, refs, False),
                                     ("constrained+rhyme", asked, refs, True),
                                     ("acrostic", acrostics, [refs[i] for i in keep], False)):
        if batch:
            outs = [nbest[0] for nbest in write_poems(translator, batch, rhyme=rhyme, beam=5)]
            result[name] = poem_scores(batch, [o.text for o in outs], gold,
                                       sum(o.error is not None for o in outs))
    result["acrostic_prompts"] = len(keep)
    return result


def markdown(results: dict) -> str:
    title = ("### Couplets and poems (transformer-small), test sets decoded with beam 5; "
             "BLEU on characters (sacreBLEU signature in applications.json)")
    lines = [title, ""]
    header = ["app", "test set", "decoding", "updates", "train s", "BLEU (char)", "length",
              "pattern",
              "tone rule", "rhyme", "layout", "distinct-1/2", "no output"]
    rows = []
    for app, res in results.items():
        for split, by_mode in res["tests"].items():
            for mode, m in by_mode.items():
                if not isinstance(m, dict):
                    continue  # a count
                prompts_ = by_mode["acrostic_prompts"] if mode == "acrostic" else None
                rows.append([app, f"{split} ({prompts_ or by_mode['sentences']})", mode,
                             res["train"]["steps"], round(res["train"]["train_seconds"]),
                             m["bleu_char"],
                             *(f"{m[k]:.1f} %" if k in m else "–"
                               for k in ("length_match", "pattern_match", "tone_rule",
                                         "rhyme", "layout_ok")),
                             f"{m['distinct_1']:.3f} / {m['distinct_2']:.3f}", m["failed"]])
    return "\n".join(lines + markdown_table(header, rows))


def text_rows(app: str, res: dict) -> list[list[object]]:
    """Table rows of one text app: its scores with the reference they are measured against."""
    def fmt(scores: dict) -> str:
        return " / ".join(f"{v['score']:.2f}" for v in scores.values())
    head = [app, res["train"]["steps"], round(res["train"]["train_seconds"])]
    rows = []
    for split, m in res["tests"].items():
        cut = f"{m['inputs_cut']} / {m['sentences']}"
        rows += baseline_rows(app, split, m.get("baseline"))
        if "bleu" in m:
            rows.append([*head, split, "beam", "BLEU (zh) / chrF",
                         f"{m['bleu']['score']:.2f} / {m['chrf']['score']:.2f}",
                         f"out/ref {m['chars_out_per_ref']}, ref/src {m['chars_ref_per_src']}",
                         cut])
        for ref in ("original", "annotators"):
            if ref in m:
                rows.append([*head, split, "beam", f"ROUGE-1/2/L vs {ref}", fmt(m[ref]),
                             f"{m['words_out']} words (ref {m['words_ref']})", cut])
        for mode in ("beam", "beam+no-repeat-3"):
            if mode in m:
                for ref, scores in m[mode].items():
                    if isinstance(scores, dict):
                        rows.append([*head, split, mode, f"ROUGE-L / BLEU vs {ref}",
                                     fmt(scores), (f"{m[mode]['words_out']} words "
                                     f"(ref {m['words_ref']})"), cut])
    return rows


def baseline_rows(app: str, split: str, base: dict | None) -> list[list[object]]:
    """The rows of a text app's model-free baseline (no updates, no training)."""
    if not base:
        return []
    head = [app, "–", "–", split, base["name"]]
    if "bleu" in base:
        return [[*head, "BLEU (zh) / chrF",
                 f"{base['bleu']['score']:.2f} / {base['chrf']['score']:.2f}", "–", "–"]]
    return [[*head, f"ROUGE-1/2/L vs {ref}",
             " / ".join(f"{v['score']:.2f}" for v in base[ref].values()), "4 words", "–"]
            for ref in ("original", "annotators")]


def text_markdown(results: dict) -> str:
    header = ["app", "updates", "train s", "test set", "decoding", "metric", "score",
              "length", "inputs cut"]
    rows = [row for app, res in results.items() if app in TEXT_APPS
            for row in text_rows(app, res)]
    title = ("### Classical <-> modern Chinese, summarisation, QA (transformer-small, beam 5; "
             "signatures in applications.json)")
    return "\n".join([title, "", *markdown_table(header, rows)])


def examples_markdown(results: dict) -> str:
    """Five outputs per text app next to their sources and references."""
    lines = ["### Examples (beam 5; QA with no repeated 3-grams)", ""]
    for app, res in results.items():
        for split, m in res["tests"].items():
            if "examples" not in m:
                continue
            lines += [f"#### {app} ({split})", ""]
            for ex in m["examples"]:
                lines += [f"- source: {ex['source'][:300]}", f"  - output: {ex['output']}",
                          f"  - reference: {ex['reference'][:300]}"]
            lines.append("")
    return "\n".join(lines)


def evaluate(app: str, work: Path, args) -> dict:
    """Every test set of ``app`` decoded and scored."""
    if app in TEXT_APPS:
        tests = run_config(app, work, args)["data"]["test"]
        return {split: evaluate_text(app, work, Path(prefix), args.limit)
                for split, prefix in tests.items()}
    score = evaluate_couplets if app == "couplet" else evaluate_poems
    return {split: score(work / "model", work / "raw", split, args.limit)
            for split in APPS[app]["tests"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_study_arguments(ap, ROOT / "runs" / "apps", "every application's")
    ap.set_defaults(budget=0.0)
    ap.add_argument("--apps", default=",".join(APPS), help=f"of {','.join(APPS)}")
    ap.add_argument("--limit", type=int, default=0,
                    help="score only the first N lines of each test set (0 = all)")
    args = ap.parse_args()
    apps = args.apps.split(",")
    if unknown := [app for app in apps if app not in APPS]:
        sys.exit(f"--apps: unknown {', '.join(unknown)}; choose from {', '.join(APPS)}")
    for app in list(apps):
        if missing := [f for f in APPS[app]["data"] if not (SHARED / f).is_dir()]:
            print(f"skipped {app}: {SHARED} has no {', '.join(missing)} (set "
                  "XINDA_SHARED_DATA)", flush=True)
            apps.remove(app)
    if not apps:
        return
    out = ROOT / "docs" / "results"
    saved = out / "applications.json"  # results of applications not rerun are kept
    results = json.loads(saved.read_text()) if saved.exists() else {}
    for app in apps:
        work = args.workdir / app
        stats, cfg = train(app, work, args)
        results[app] = {"train": stats, "tests": evaluate(app, work, args), "config": cfg,
                        "code": code_version()}
        print(json.dumps(results[app], ensure_ascii=False), flush=True)
        saved.write_text(json.dumps(results, indent=1, ensure_ascii=False))
    tables = [markdown({a: r for a, r in results.items() if a not in TEXT_APPS}),
              text_markdown(results), examples_markdown(results)]
    (out / "applications.md").write_text("\n\n".join(tables) + "\n", encoding="utf-8")
    print(tables[0] + "\n\n" + tables[1])


if __name__ == "__main__":
    main()
