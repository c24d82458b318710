"""The golden file of a real model's greedy runs: what the references write and the tests read.

A reference (transformers' LlamaForCausalLM in compare_with_transformers.py, the plain-numpy
llama_numpy_reference.py) runs each of PROMPTS through the model's chat template and greedily
for STEPS tokens, never stopping at end of sequence; greedy_run() here drives it and records, per
prompt: the prompt text and ids, the STEPS greedy ids (argmax, lowest id on ties), where the
first end-of-sequence token falls, the TOP_K largest (id, logit) of the first LOGIT_STEPS steps,
and for every step the runner-up id and its margin (top logit minus the runner-up's), which says
where a near-tie allows another implementation to pick differently. golden_document() adds the
model files' sha256 (a golden file belongs to one conversion of the weights) and the reference's
name. Plain Python (numpy only inside the references), so that the CPU test needs nothing else.
"""
import hashlib
import heapq
import json
import math
import os

FORMAT = "asynct-greedy-golden-1"
STEPS = 64
TOP_K = 20
LOGIT_STEPS = 4
HASHED_FILES = ("config.json", "model.safetensors")

# Chat user messages: a question, an instruction, a list, a story start, a code request, a
# rewrite; varied lengths so that the batch's prompts differ.
PROMPTS = [
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "List five fruits that are red.",
    "Continue this story: The old lighthouse keeper heard a knock at the door, although no ship had come in for years.",
    "Write a Python function that returns the factorial of a number.",
    "Rewrite this sentence to be more polite: Give me the report now.",
]


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def model_hashes(model_dir):
    return {name: sha256_of(os.path.join(model_dir, name)) for name in HASHED_FILES}


def eos_token_ids(model_dir):
    """HuggingFace's reading: generation_config.json's eos_token_id when it has one, else config.json's."""
    for name in ("generation_config.json", "config.json"):
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            with open(path) as f:
                eos = json.load(f).get("eos_token_id")
            if eos is not None:
                return sorted(eos) if isinstance(eos, list) else [eos]
    return []


def ranked(logits, count):
    """The `count` largest logits as [(id, value)], value descending, lowest id first on ties."""
    values = logits.tolist() if hasattr(logits, "tolist") else [float(v) for v in logits]
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise ValueError(f"logit {i} is {v}")
    order = heapq.nlargest(count, range(len(values)), key=lambda i: (values[i], -i))
    return [(i, values[i]) for i in order]


def greedy_run(reference, text, prompt_ids, eos_ids, decode, steps=STEPS):
    """Runs `reference` greedily for `steps` tokens; returns (the golden record, every step's logits).

    reference.start(ids) gives the logits after a prompt, reference.next(token) those after one
    more token (each a 1-D sequence of floats over the vocabulary); decode(ids) gives text."""
    record = {"text": text, "prompt_ids": [int(i) for i in prompt_ids], "tokens": [], "first_eos": None,
              "top_logits": [], "runner_up": [], "margin": []}
    all_logits = []
    logits = reference.start(list(prompt_ids))
    for step in range(steps):
        top = ranked(logits, TOP_K)
        token, runner_up = top[0][0], top[1]
        record["tokens"].append(token)
        record["runner_up"].append(runner_up[0])
        record["margin"].append(round(top[0][1] - runner_up[1], 6))
        if step < LOGIT_STEPS:
            record["top_logits"].append([[i, round(v, 6)] for i, v in top])
        if token in eos_ids and record["first_eos"] is None:
            record["first_eos"] = step
        all_logits.append(logits)
        if step + 1 < steps:
            logits = reference.next(token)
    record["continuation"] = decode(record["tokens"])
    return record, all_logits


def golden_document(model_dir, reference_name, records):
    return {
        "format": FORMAT,
        "about": "Greedy continuations of chat prompts, never stopped at end of sequence, with the reference's "
                 "top logits of the first steps and its top-two margin at every step. Checked by "
                 "tests/model/check_golden.py; made by tests/model/compare_with_transformers.py --write-golden "
                 "(or llama_numpy_reference.py --write-golden).",
        "reference": reference_name,
        "model_sha256": model_hashes(model_dir),
        "steps": STEPS,
        "top_k": TOP_K,
        "logit_steps": LOGIT_STEPS,
        "eos_token_ids": eos_token_ids(model_dir),
        "prompts": records,
    }


def write_golden(path, document):
    """One line per prompt field list: small, and diffs of a regenerated file stay readable."""
    with open(path, "w") as f:
        f.write("{\n")
        head = [k for k in document if k != "prompts"]
        for k in head:
            f.write(f"  {json.dumps(k)}: {json.dumps(document[k])},\n")
        f.write('  "prompts": [\n')
        for n, record in enumerate(document["prompts"]):
            fields = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in record.items()]
            f.write("   {\n" + ",\n".join(fields) + "\n   }" + ("," if n + 1 < len(document["prompts"]) else "") + "\n")
        f.write("  ]\n}\n")


def load_golden(path):
    with open(path) as f:
        document = json.load(f)
    if document.get("format") != FORMAT:
        raise ValueError(f"{path}: format {document.get('format')!r}, expected {FORMAT!r}")
    return document


def greedy_agreement(engine_tokens, record, tie, steps):
    """How many of the first `steps` greedy tokens the engine shares with the reference, and a note
    on the first divergence: a near-tie when the engine took the reference's runner-up and the
    reference's top-two margin there is at most `tie` (the two implementations' rounding can
    swap them), else a real one. The comparison ends at the first divergence either way."""
    for step in range(steps):
        if step >= len(engine_tokens):
            return step, f"the engine stopped after {len(engine_tokens)} tokens", False
        got, want = engine_tokens[step], record["tokens"][step]
        if got != want:
            margin = record["margin"][step]
            near_tie = got == record["runner_up"][step] and margin <= tie
            kind = "near-tie" if near_tie else "real"
            return step, (f"{kind} divergence at step {step}: {got} for {want} (reference margin {margin:.2e}"
                          f"{', runner-up' if got == record['runner_up'][step] else ''}; tie {tie:.1e})"), near_tie
    return steps, "", True


def check_record(record, tokens, step_logits, tolerance, steps):
    """Another implementation's run of one golden prompt against the record.

    tokens: its greedy tokens from the prompt; step_logits: its logits (over the vocabulary) after
    the prompt and after the prompt + the record's first k tokens, for k = 0, 1, ... (at most
    LOGIT_STEPS). Each golden (id, logit) must be matched within `tolerance` (absolute), and no
    other id may rise above the golden k-th largest by more than it; the first `steps` tokens
    must be the record's, with a near-tie (margin <= tolerance) allowed to end the comparison.
    Returns a dict: worst logit difference, tokens agreeing, note, ok."""
    worst, problems = 0.0, []
    for k, logits in enumerate(step_logits):
        golden_top = record["top_logits"][k]
        for token, value in golden_top:
            difference = abs(float(logits[token]) - value)
            if difference > worst:
                worst = difference
        floor, golden_ids = golden_top[-1][1], {token for token, _ in golden_top}
        for token, value in ranked(logits, len(golden_top)):
            if token not in golden_ids and value > floor + tolerance:
                problems.append(f"step {k}: id {token} (logit {value:.4f}) is above the golden top-{len(golden_top)}")
    if worst > tolerance:
        problems.append(f"top-{len(record['top_logits'][0])} logits differ by up to {worst:.2e} (tolerance {tolerance:.0e})")
    same, divergence, tokens_ok = greedy_agreement(tokens, record, tolerance, steps)
    return {"worst": worst, "same": same, "note": "; ".join(problems + ([divergence] if divergence else [])),
            "ok": tokens_ok and not problems}
