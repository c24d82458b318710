"""Runs `asynct generate` on token-id prompts and reads back its --logits file: per request, the
generated tokens and the logits the first of them came from.

The option that takes a prompt as token ids is --prompt-ids where the binary has text prompts
(then --prompt is text), else --prompt; `asynct generate --help` says which.
"""
import json
import os
import subprocess


class EngineError(RuntimeError):
    pass


def prompt_ids_option(binary):
    help_text = subprocess.run([binary, "generate", "--help"], capture_output=True, text=True, timeout=60).stdout
    return "--prompt-ids" if "--prompt-ids" in help_text else "--prompt"


def device_options(device):
    """asynct's options for a device name: cpu, cuda, or cpu-reference (the CPU reference backend)."""
    return ["--device", "cpu", "--cpu-reference"] if device == "cpu-reference" else ["--device", device]


def generate(binary, model_dir, prompts, max_tokens, device, workdir, name="logits.json", extra=()):
    """[{"tokens": [...], "first_logits": [...]}] for each prompt, greedy, never stopped at EOS.
    device: cpu, cuda or cpu-reference; extra: more asynct options (e.g. --quantization fp8)."""
    logits_path = os.path.join(workdir, name)
    cmd = [binary, "generate", "--model", model_dir, "--max-tokens", str(max_tokens), "--ignore-eos",
           "--logits", logits_path] + device_options(device) + list(extra)
    option = prompt_ids_option(binary)
    for ids in prompts:
        cmd += [option, ",".join(map(str, ids))]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        said = (run.stderr.strip() or run.stdout.strip())[-2000:]
        raise EngineError(f"asynct generate --model {model_dir} {' '.join(device_options(device))} exited {run.returncode}: {said}")
    with open(logits_path) as f:
        results = json.load(f)
    if len(results) != len(prompts):
        raise EngineError(f"{logits_path}: {len(results)} requests, expected {len(prompts)}")
    return results
