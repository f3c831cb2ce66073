"""The textbook's other encoder-decoder applications, scored on their test sets: classical <->
modern Chinese (BLEU --tokenize zh, chrF, length ratios), e-mail subject lines (AESLC, ROUGE)
and medical question answering (MedQuAD, ROUGE-L and BLEU). Used by ``applications.py``.

Every app trains ``recipes/{app}.yaml`` on ``../shared/data`` as it is (no corpus writer) and
decodes with beam 5. Each result keeps five examples (source, output, reference) taken at even
intervals through the test set, and the counts of inputs cut to the model's length limits.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from xinda.decode.translator import Translation, Translator
from xinda.evaluate.metrics import Score, corpus_scores
from xinda.utils import read_lines

EXAMPLES = 5


def _score(s: Score) -> dict:
    return {"score": round(s.score, 2), "signature": s.signature}


def _examples(sources: list[str], outputs: list[str], refs: list[str]) -> list[dict]:
    step = max(len(sources) // EXAMPLES, 1)
    return [{"source": sources[i], "output": outputs[i], "reference": refs[i]}
            for i in range(0, len(sources), step)][:EXAMPLES]


def _best(results: list[list[Translation]]) -> tuple[list[str], int]:
    """The best output of each line, and how many inputs were cut to max_input_len."""
    return ([nbest[0].text for nbest in results],
            sum(nbest[0].truncated_from is not None for nbest in results))


def _chars(lines: list[str]) -> int:
    return sum(len("".join(line.split())) for line in lines)


def translation(translator: Translator, test: Path, src: str, tgt: str, limit: int) -> dict:
    """Classical <-> modern: BLEU (zh) and chrF, and output length against the reference (the
    textbook: classical text is short, its modern rendering long)."""
    sources = list(read_lines(f"{test}.{src}"))[:limit or None]
    refs = list(read_lines(f"{test}.{tgt}"))[:limit or None]
    outputs, cut = _best(translator.translate(sources, beam=5))
    bleu, chrf = corpus_scores(outputs, refs, ("bleu", "chrf"), tokenize="zh")
    return {"sentences": len(sources), "bleu": _score(bleu), "chrf": _score(chrf),
            "chars_out_per_ref": round(_chars(outputs) / _chars(refs), 3),
            "chars_ref_per_src": round(_chars(refs) / _chars(sources), 3),
            "chars_out_per_src": round(_chars(outputs) / _chars(sources), 3),
            "inputs_cut": cut, "examples": _examples(sources, outputs, refs)}


def _rouge(outputs: list[str], refs) -> dict:
    return {s.name: _score(s) for s in corpus_scores(outputs, refs, ("rouge",))}


def summaries(translator: Translator, test: Path, src: str, tgt: str, limit: int) -> dict:
    """AESLC: ROUGE-1/2/L against the original subject and against the three annotators'
    subjects (each sentence's F1 averaged over the three)."""
    docs = list(read_lines(f"{test}.{src}"))[:limit or None]
    subjects = list(read_lines(f"{test}.{tgt}"))[:limit or None]
    annotators = [list(read_lines(f"{test}.ann{k}"))[:limit or None] for k in range(3)]
    outputs, cut = _best(translator.translate(docs, beam=5))
    return {"sentences": len(docs), "original": _rouge(outputs, subjects),
            "annotators": _rouge(outputs, annotators),
            "words_out": round(sum(len(o.split()) for o in outputs) / len(outputs), 2),
            "words_ref": round(sum(len(s.split()) for s in subjects) / len(subjects), 2),
            "inputs_cut": cut, "examples": _examples(docs, outputs, subjects)}


def opening(translator: Translator, answer: str, pieces: int) -> str:
    """The first ``pieces`` target pieces of ``answer`` as text: what training kept of it."""
    ids = translator.encode_target(answer)[:pieces]
    return translator.tgt_text.postprocess(translator.tgt_vocab.decode(ids))


def _qa_scores(outputs: list[str], answers: list[str], openings: list[str]) -> dict:
    def both(refs: list[str]) -> dict:
        bleu, rouge_l = corpus_scores(outputs, refs, ("bleu", "rouge"))[0::3]
        return {"rougeL": _score(rouge_l), "bleu": _score(bleu)}
    return {"whole answer": both(answers), "answer opening": both(openings),
            "words_out": round(sum(len(o.split()) for o in outputs) / len(outputs), 1)}


def answers(translator: Translator, test: Path, src: str, tgt: str, limit: int) -> dict:
    """MedQuAD: ROUGE-L and BLEU against the whole answer and against its opening (the
    data.max_len pieces training kept), with plain beam search and with no repeated 3-grams."""
    questions = list(read_lines(f"{test}.{src}"))[:limit or None]
    refs = list(read_lines(f"{test}.{tgt}"))[:limit or None]
    pieces = translator.cfg.data.max_len
    openings = [opening(translator, a, pieces) for a in refs]
    plain, cut = _best(translator.translate(questions, beam=5))
    norepeat = translator.constraints_for(questions, no_repeat_ngram=3)
    varied, _ = _best(translator.translate(questions, beam=5, constraints=norepeat))
    return {"sentences": len(questions), "target_pieces": pieces,
            "words_ref": round(sum(len(a.split()) for a in refs) / len(refs), 1),
            "beam": _qa_scores(plain, refs, openings),
            "beam+no-repeat-3": _qa_scores(varied, refs, openings),
            "inputs_cut": cut, "examples": _examples(questions, varied, refs)}


def baseline(app: str, test: Path, src: str, tgt: str, limit: int) -> dict | None:
    """A model-free reference point, scored like the model: the source copied (classical <->
    modern share most characters) or the e-mail's first four words (the median subject has
    three or four). None for QA (no sensible copy)."""
    sources = list(read_lines(f"{test}.{src}"))[:limit or None]
    refs = list(read_lines(f"{test}.{tgt}"))[:limit or None]
    if TEXT_APPS[app][1] is translation:
        bleu, chrf = corpus_scores(sources, refs, ("bleu", "chrf"), tokenize="zh")
        return {"name": "copy the source", "bleu": _score(bleu), "chrf": _score(chrf)}
    if TEXT_APPS[app][1] is summaries:
        lead = [" ".join(doc.split()[:4]) for doc in sources]
        annotators = [list(read_lines(f"{test}.ann{k}"))[:limit or None] for k in range(3)]
        return {"name": "first 4 words", "original": _rouge(lead, refs),
                "annotators": _rouge(lead, annotators)}
    return None


# app -> (shared corpus folder, scorer)
TEXT_APPS: dict[str, tuple[str, Callable[..., dict]]] = {
    "classical-modern": ("classical-modern", translation),
    "modern-classical": ("classical-modern", translation),
    "aeslc-subject": ("summarization-aeslc", summaries),
    "medquad-qa": ("qa-medquad", answers),
}


def evaluate(app: str, workdir: Path, test: Path, limit: int = 0) -> dict:
    """Decode and score ``app``'s test set ``test`` (a file prefix) with its trained model."""
    translator = Translator.load(workdir / "model")
    data = translator.cfg.data
    result = TEXT_APPS[app][1](translator, test, data.src_lang, data.tgt_lang, limit)
    result["baseline"] = baseline(app, test, data.src_lang, data.tgt_lang, limit)
    manifest = json.loads((workdir / "data-bin" / "manifest.json").read_text())
    result["train_pairs_cut"] = manifest["filter_report"].get("truncated")
    return result
