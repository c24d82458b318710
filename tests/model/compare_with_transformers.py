#!/usr/bin/env python3
"""The engine on SmolLM2-135M-Instruct (a trained LlamaForCausalLM) against HuggingFace
transformers, end to end from chat prompts.

The prompts (golden.py's) go through the HuggingFace tokenizer's chat template
(apply_chat_template, add_generation_prompt=True); transformers' LlamaForCausalLM runs them in
float32 (the weights are bf16, exact in float32; TF32 off) on the GPU when PyTorch sees one,
else on the CPU, greedily for 64 tokens without stopping at end of sequence (the first EOS is
reported). asynct generates from the same ids (--ignore-eos, --logits) on each device and must:
- match the reference's first-token logits within a relative (Frobenius) error of 1e-4 on the
  CPU (float32 against float32) and 1e-2 on CUDA (bf16 activations);
- produce the same 64 greedy tokens, with compare_with_pytorch.py's allowance: where the
  reference's top-two margin is within TIE_FACTOR x the engine's RMS logit error on the first
  token, the engine may take the runner-up; that ends the prompt's comparison.

    python3 tests/model/compare_with_transformers.py --asynct build/release/src/asynct \\
        --model ~/.cache/asynct/smollm2-135m-instruct [--write-golden tests/model/data/smollm2_golden.json]

--write-golden PATH writes the golden file that tests/model/check_golden.py (the CPU test)
checks against, from this float32 reference run; --golden PATH checks the reference run itself
against an existing golden file as check_golden.py checks the engine (e.g. the numpy
reference's). Without --asynct only the reference runs. Exit status 1 when anything fails.
Needs PyTorch, transformers (5.x), numpy.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import asynct_generate  # noqa: E402
import golden  # noqa: E402

LOGIT_TOLERANCE = {"cpu-reference": 1e-4, "cpu": 1e-2, "cuda": 1e-2}
TIE_FACTOR = 4.0
GOLDEN_TOLERANCE = 1e-3  # check_golden.py's default, for --golden


class TorchReference:
    """golden.greedy_run()'s interface over a transformers model with its KV cache."""

    def __init__(self, model):
        self.model, self.device, self.past = model, next(model.parameters()).device, None

    def _logits(self, ids, past):
        with torch.no_grad():
            out = self.model(torch.tensor([ids], device=self.device), past_key_values=past, use_cache=True)
        self.past = out.past_key_values
        return out.logits[0, -1].double().cpu().numpy()

    def start(self, ids):
        return self._logits(ids, None)

    def next(self, token):
        return self._logits([token], self.past)


def chat_prompt_ids(tokenizer, text):
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded  # a BatchEncoding in transformers 5
    return [int(i) for i in ids]


def run_reference(model_dir, device):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    eos = golden.eos_token_ids(model_dir)
    records, step_logits = [], []
    for text in golden.PROMPTS:
        record, logits = golden.greedy_run(TorchReference(model), text, chat_prompt_ids(tokenizer, text), eos,
                                           lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
        records.append(record)
        step_logits.append(logits)
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    name = f"transformers {transformers.__version__} LlamaForCausalLM, float32 ({where}, torch {torch.__version__})"
    return name, records, step_logits


def bf16_first_logits(model_dir, records):
    """transformers' own bfloat16 run of each prompt on the GPU (its first-token logits): how far
    bf16 arithmetic alone moves the logits from the float32 reference, beside the engine's."""
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to("cuda").eval()
    out = []
    with torch.no_grad():
        for record in records:
            logits = model(torch.tensor([record["prompt_ids"]], device="cuda")).logits[0, -1]
            out.append(logits.double().cpu().numpy())
    del model
    return out


def short(text, width=40):
    return text if len(text) <= width else text[: width - 3] + "..."


def compare_engine(binary, model_dir, device, records, step_logits):
    """The table's rows for one device; returns the number of failed prompts."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as workdir:
        try:
            results = asynct_generate.generate(binary, model_dir, [r["prompt_ids"] for r in records], golden.STEPS,
                                               device, workdir)
        except asynct_generate.EngineError as e:
            print(f"{device:4} FAIL: {e}")
            return len(records)
    seconds = time.monotonic() - start
    print(f"\nasynct --device {device} ({seconds:.1f} s) against the reference; logits bar {LOGIT_TOLERANCE[device]:.0e}")
    bf16 = bf16_first_logits(model_dir, records) if device == "cuda" and torch.cuda.is_available() else None
    print(f"{'device':6} {'prompt':40} {'ids':>4} {'logits rel err':>14} {'hf bf16 err':>11} {'greedy':>7} {'EOS ref/asynct':>14}  result")
    failures = 0
    eos = set(golden.eos_token_ids(model_dir))
    for index, (record, logits, result) in enumerate(zip(records, step_logits, results)):
        reference = np.asarray(logits[0], dtype=np.float64)
        got = np.asarray(result["first_logits"], dtype=np.float64)
        error = np.linalg.norm(got - reference) / np.linalg.norm(reference)
        bf16_error = f"{np.linalg.norm(bf16[index] - reference) / np.linalg.norm(reference):11.2e}" if bf16 else f"{'-':>11}"
        tie = TIE_FACTOR * float(np.sqrt(np.mean((got - reference) ** 2)))
        same, note, tokens_ok = golden.greedy_agreement(result["tokens"], record, tie, golden.STEPS)
        ok = error <= LOGIT_TOLERANCE[device] and tokens_ok
        failures += not ok
        engine_eos = next((i for i, t in enumerate(result["tokens"]) if t in eos), None)
        print(f"{device:6} {short(record['text']):40} {len(record['prompt_ids']):4} {error:14.2e} {bf16_error} "
              f"{same:3}/{golden.STEPS:<3} {str(record['first_eos']):>6}/{str(engine_eos):<7}  "
              f"{'ok' if ok else 'FAIL'}{': ' + note if note else ''}")
    return failures


def check_reference_against_golden(path, model_dir, records, step_logits):
    """The reference run checked as check_golden.py checks the engine (teacher-forced logits are
    the reference's own steps while its tokens agree with the golden's)."""
    document = golden.load_golden(path)
    print(f"\nthis reference against {path} ({document['reference']}), tolerance {GOLDEN_TOLERANCE:.0e}")
    if document["model_sha256"] != golden.model_hashes(model_dir):
        print(f"FAIL: {path} was made from other model files")
        return 1
    failures = 0
    for record, logits in zip(document["prompts"], step_logits):
        mine = next(r for r in records if r["text"] == record["text"])
        if mine["prompt_ids"] != record["prompt_ids"]:
            print(f"{short(record['text']):40} FAIL: the prompt's ids differ from the golden's")
            failures += 1
            continue
        agree = golden.greedy_agreement(mine["tokens"], record, 0.0, document["logit_steps"])[0]
        result = golden.check_record(record, mine["tokens"], logits[: min(agree + 1, document["logit_steps"])],
                                     GOLDEN_TOLERANCE, document["steps"])
        failures += not result["ok"]
        print(f"{short(record['text']):40} top logits err {result['worst']:.2e}, greedy {result['same']}/{document['steps']} "
              f"{'ok' if result['ok'] else 'FAIL'}{': ' + result['note'] if result['note'] else ''}")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asynct", help="the asynct binary (without it, only the reference runs)")
    parser.add_argument("--model", default=os.path.join(os.environ.get("ASYNCT_CACHE", os.path.expanduser("~/.cache/asynct")),
                                                        "smollm2-135m-instruct"),
                        help="the converted SmolLM2 directory (scripts/fetch_smollm2.sh)")
    parser.add_argument("--devices", help="asynct devices, comma-separated: cpu-reference, cpu, cuda (default: cpu-reference and cpu, and cuda "
                             "when PyTorch sees a GPU)")
    parser.add_argument("--write-golden", metavar="PATH", help="write the golden file from this reference run")
    parser.add_argument("--golden", metavar="PATH", help="check this reference run against a golden file")
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        sys.exit(f"compare_with_transformers: no model at {args.model} (scripts/fetch_smollm2.sh makes it)")

    reference_device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.monotonic()
    name, records, step_logits = run_reference(args.model, reference_device)
    print(f"reference: {name}: {len(records)} prompts x {golden.STEPS} greedy steps in {time.monotonic() - start:.1f} s")
    for record in records:
        print(f"  {short(record['text'])!r:44} {len(record['prompt_ids']):3} ids, first EOS at step "
              f"{record['first_eos']}: {short(record['continuation'], 70)!r}")
    if args.write_golden:
        golden.write_golden(args.write_golden, golden.golden_document(args.model, name, records))
        print(f"wrote {args.write_golden} ({os.path.getsize(args.write_golden)} bytes)")

    failures, checked = 0, 0
    if args.golden:
        failures += check_reference_against_golden(args.golden, args.model, records, step_logits)
        checked += len(records)
    if args.asynct:
        devices = args.devices.split(",") if args.devices else ["cpu-reference", "cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        for device in devices:
            failures += compare_engine(args.asynct, args.model, device, records, step_logits)
            checked += len(records)
    if checked:
        print(f"{checked - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
