"""The engine against independent PyTorch implementations on the same random checkpoints:
Qwen3 and Llama (3 query heads per KV head) against HuggingFace transformers' Qwen3ForCausalLM
and LlamaForCausalLM, AsyncT against python/asynct_reference. Compares the first generated token's logits (relative Frobenius error)
and the greedy tokens of several prompts for 32 steps.
- CPU engine against PyTorch in float32 on the CPU: logits within 1e-4 (both compute in float32
  or better from the same bf16-exact weights).
- CUDA engine (when PyTorch sees a GPU, bf16 activations) against the same float32 PyTorch on the
  GPU: logits within 1e-2 for Qwen3 and Llama. For AsyncT within max(1e-2, 2.5 x the error of PyTorch's own
  bf16 run of that prompt): AsyncT's Peri-LN output norms rescale rows whose gated attention
  output is nearly empty, so the model amplifies bf16 rounding to about the 1% level wherever it
  happens. PyTorch's own bf16 run misses 1e-2 on 16 of 20 prompts of the seed 11-14 test models
  (up to 2.4%), and a float32 model of the engine's rounding points (rounding_budget.py) lands at
  0.5-2.0x PyTorch's bf16 error on the same 20; a real defect (pool window 2 in one layer)
  errs by 16-46%, and the kernels themselves are checked against float64 in the GPU tests.
Greedy tokens must agree for all 32 steps, with one allowance: the CUDA engine rounds to bf16, so
where the float32 reference's top two logits are closer than the engine's own logit error
(TIE_FACTOR x the RMS logit error measured on the first token) it may pick the other one. The
first such divergence ends the comparison of that prompt and is reported with its margin.

Needs PyTorch and transformers (CTest label "torch"; not part of CI).
Usage: python3 tests/model/compare_with_pytorch.py --asynct build/release/src/asynct
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [200, 17], [9] * 20 + [31, 64, 5], [255, 0, 128, 64], list(range(40, 100, 3))]
STEPS = 32
ARCHITECTURES = ("qwen3", "asynct", "llama")
LOGIT_TOLERANCE = {"cpu": 1e-4, "cuda": 1e-2}
BF16_FACTOR = 2.5  # AsyncT on the GPU: times PyTorch's own bf16 error on the prompt (see above)
TIE_FACTOR = 4.0


def engine_run(binary, checkpoint, workdir, device):
    logits_path = os.path.join(workdir, "logits.json")
    # On the CPU the reference backend: the tolerance is for float32 weights and float64 sums.
    cmd = [binary, "generate", "--model", checkpoint, "--max-tokens", str(STEPS), "--logits", logits_path,
           "--device", device] + (["--cpu-reference"] if device == "cpu" else [])
    for p in PROMPTS:
        cmd += ["--prompt-ids", ",".join(map(str, p))]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(logits_path) as f:
        return json.load(f)


def load_pytorch(arch, checkpoint, device, dtype=torch.float32):
    """float32 is the truth the engine's bf16 path is measured against; bfloat16 shows how much
    the model itself amplifies bf16 rounding on a prompt (printed beside the engine's error)."""
    if arch == "qwen3":
        from transformers import Qwen3ForCausalLM
        return Qwen3ForCausalLM.from_pretrained(checkpoint, torch_dtype=dtype).to(device).eval()
    if arch == "llama":
        from transformers import LlamaForCausalLM
        return LlamaForCausalLM.from_pretrained(checkpoint, torch_dtype=dtype).to(device).eval()
    from asynct_reference import load_asynct
    return load_asynct(checkpoint, dtype=dtype, device=device)


def logits_of(model, ids):
    device = next(model.parameters()).device
    out = model(torch.tensor([ids], device=device))
    return (out.logits if hasattr(out, "logits") else out)[0, -1].double()


@torch.no_grad()
def compare(binary, arch, workdir, device):
    checkpoint = os.path.join(workdir, arch)
    if not os.path.exists(checkpoint):
        subprocess.run([binary, "init-checkpoint", "--arch", arch, "--seed", "11", "--out", checkpoint],
                       check=True, stdout=subprocess.DEVNULL)
    engine = engine_run(binary, checkpoint, workdir, device)
    model = load_pytorch(arch, checkpoint, device)
    # The CUDA engine computes in bf16: PyTorch's own bf16 run of the same model, against its
    # float32 run, says how much of the engine's error the model's conditioning explains (a
    # random AsyncT amplifies bf16 rounding where a row's attention output is nearly empty and
    # its output norm scales it back up).
    model_bf16 = load_pytorch(arch, checkpoint, device, torch.bfloat16) if device == "cuda" else None
    failures = 0
    for prompt, result in zip(PROMPTS, engine):
        ref = logits_of(model, prompt)
        got = torch.tensor(result["first_logits"], dtype=torch.float64, device=ref.device)
        err = ((got - ref).norm() / ref.norm()).item()
        bf16_note, tolerance = "", LOGIT_TOLERANCE[device]
        if model_bf16 is not None:
            bf16_err = ((logits_of(model_bf16, prompt) - ref).norm() / ref.norm()).item()
            if arch == "asynct":
                tolerance = max(tolerance, BF16_FACTOR * bf16_err)
            bf16_note = f" (PyTorch in bf16: {bf16_err:.2e}; bar {tolerance:.2e})"
        tie = TIE_FACTOR * (got - ref).norm().item() / len(ref) ** 0.5 if device == "cuda" else 0.0
        ids, same, note = list(prompt), 0, ""
        for engine_token in result["tokens"][:STEPS]:
            logits = logits_of(model, ids)
            token = int(logits.argmax())
            if token != engine_token:
                margin = (logits[token] - logits[engine_token]).item()
                note = f", then a {'near-tie' if margin <= tie else 'real'} divergence (margin {margin:.4f}, tie {tie:.4f})"
                break
            same += 1
            ids.append(token)
        ok = err <= tolerance and (same == STEPS or "near-tie" in note)
        failures += not ok
        print(f"{device:4} {arch:7} prompt of {len(prompt):2} tokens: logits rel err {err:.2e}{bf16_note}, "
              f"greedy tokens agree for {same}/{STEPS} steps{note} {'ok' if ok else 'FAIL'}")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--asynct", required=True, help="the asynct binary")
    args = parser.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    with tempfile.TemporaryDirectory() as workdir:
        failures = sum(compare(args.asynct, arch, workdir, device) for device in devices for arch in ARCHITECTURES)
    total = len(PROMPTS) * len(ARCHITECTURES) * len(devices)
    print(f"{total - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
