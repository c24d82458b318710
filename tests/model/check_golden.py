#!/usr/bin/env python3
"""The engine on a real trained model against its golden file (CTest model_smollm2_golden, CPU).

    python3 tests/model/check_golden.py --asynct build/release/src/asynct \\
        --golden tests/model/data/smollm2_golden.json --model ~/.cache/asynct/smollm2-135m-instruct

For each golden prompt (golden.py) asynct generates the golden number of tokens greedily, never
stopping at end of sequence, and
- its logits after the prompt and after the prompt + the golden's first 1, 2, 3 tokens (each a
  prompt of its own: the first-token logits of --logits) must match the golden top-20 (id, logit)
  within --tolerance, absolute, and no other id may rise above the golden 20th by more;
- its greedy tokens must be the golden's, except that where the reference's top-two margin is
  within --tolerance the engine may take the runner-up (the two float32 computations round
  differently); that ends the prompt's comparison.
The default tolerance, 1e-3, is for float32 on the CPU against a float32 (or better) reference
(SmolLM2's top logits are 20-40): on these prompts the CPU engine's top-20 logits are within
8e-6 of the float64 numpy reference's and 4.3e-5 of transformers' float32 on the CPU, and the
smallest top-two margin of a golden greedy step is 6.4e-3.

The model comes from scripts/fetch_smollm2.sh; without it the test is skipped (exit 77). A model
whose files differ from those the golden file was made from is a failure that says so.
Plain Python: no numpy or torch.
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import asynct_generate  # noqa: E402
import golden  # noqa: E402

SKIP = 77


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asynct", required=True, help="the asynct binary")
    parser.add_argument("--golden", required=True, help="the golden file (tests/model/data/smollm2_golden.json)")
    parser.add_argument("--model", required=True, help="the model directory the golden file was made from")
    parser.add_argument("--device", default="cpu-reference",
                        help="cpu-reference (the default tolerance is for it), cpu (the production CPU backend) or cuda")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="absolute, on the logits")
    parser.add_argument("--prompts", type=int, default=0, help="only the first N prompts (0: all)")
    parser.add_argument("--steps", type=int, default=0, help="only the first N greedy tokens (0: all)")
    parser.add_argument("--asynct-option", action="append", default=[], metavar="OPTION",
                        help="passed to asynct generate (repeat it), e.g. --asynct-option=--quantization=fp8; "
                             "the report then says how far the greedy tokens follow the golden ones")
    parser.add_argument("--logit-steps", type=int, default=0,
                        help="compare the logits of only the first N steps (0: all the golden file has)")
    args = parser.parse_args()

    document = golden.load_golden(args.golden)
    if not os.path.isfile(os.path.join(args.model, "model.safetensors")):
        print(f"SKIPPED: no model at {args.model} (scripts/fetch_smollm2.sh makes it; scripts/test.sh runs it)")
        return SKIP
    hashes = golden.model_hashes(args.model)
    if hashes != document["model_sha256"]:
        print(f"FAIL: {args.model} is not the model {args.golden} was made from: sha256 {hashes}, "
              f"golden {document['model_sha256']}")
        return 1

    records = document["prompts"][: args.prompts or None]
    steps = min(args.steps or document["steps"], document["steps"])
    logit_steps = min(args.logit_steps or document["logit_steps"], document["logit_steps"], steps)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as workdir:
        try:
            extra = [part for option in args.asynct_option for part in option.split("=", 1)]
            greedy = asynct_generate.generate(args.asynct, args.model, [r["prompt_ids"] for r in records], steps,
                                              args.device, workdir, "greedy.json", extra)
            # Each later step's logits from a prompt of its own: the prompt + the golden's first k tokens.
            forced_prompts = [r["prompt_ids"] + r["tokens"][:k] for r in records for k in range(1, logit_steps)]
            forced = asynct_generate.generate(args.asynct, args.model, forced_prompts, 1, args.device, workdir,
                                              "forced.json", extra) if forced_prompts else []
        except asynct_generate.EngineError as e:
            print(f"FAIL: {e}")
            return 1
    seconds = time.monotonic() - start

    print(f"golden: {document['reference']}; {len(records)} prompts, {steps} greedy steps, "
          f"top-{document['top_k']} logits of {logit_steps} steps; asynct --device {args.device}, "
          f"{' '.join(args.asynct_option)}{' ' if args.asynct_option else ''}tolerance {args.tolerance:.0e} ({seconds:.1f} s)")
    print(f"{'prompt':42} {'ids':>4} {'top logits err':>14} {'greedy':>7}  result")
    failures = 0
    for n, record in enumerate(records):
        step_logits = [greedy[n]["first_logits"]]
        step_logits += [forced[n * (logit_steps - 1) + k]["first_logits"] for k in range(logit_steps - 1)]
        result = golden.check_record(record, greedy[n]["tokens"], step_logits, args.tolerance, steps)
        failures += not result["ok"]
        text = record["text"] if len(record["text"]) <= 40 else record["text"][:37] + "..."
        print(f"{text:42} {len(record['prompt_ids']):4} {result['worst']:14.2e} {result['same']:3}/{steps:<3}  "
              f"{'ok' if result['ok'] else 'FAIL'}{': ' + result['note'] if result['note'] else ''}")
    print(f"{len(records) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
