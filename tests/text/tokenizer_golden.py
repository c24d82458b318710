"""Golden test of asynct's tokenizer against HuggingFace `tokenizers` 0.23.3 (label cpu).

For each tokenizer file, every text of the corpus (tests/text/golden_corpus.py) is encoded by
both; the ids must be equal, decode(ids) must equal the reference's decode, the streaming
detokenizer's pieces must be valid UTF-8 and add up to decode(ids), and decode(encode(x)) must
give x back (its NFC form where the file normalizes). Seeded random id lists, some cut inside a
multi-byte character, must decode as the reference decodes them.

Files: the official Qwen3 tokenizer.json; GPT-2-style files made from its vocabulary (no
normalizer, ByteLevel's GPT-2 pattern, with and without add_prefix_space, and after a Digits
step as SmolLM2's file has, extra added tokens with lstrip / rstrip / single_word / normalized); a small BPE trained here by the reference on
the corpus (NFC, merges written in the older "a b" form).

The reference and the Qwen3 file come from scripts/fetch_text_assets.sh's cache, named by
--cache (tests/CMakeLists.txt passes $ASYNCT_CACHE or ~/.cache/asynct); when they are missing
the test fails and says how to fetch them.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_corpus  # noqa: E402


def fail(message):
    print(f"tokenizer_golden: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def load_reference(cache):
    qwen = os.path.join(cache, "qwen3", "tokenizer.json")
    python_dir = os.path.join(cache, "python")
    if not os.path.isfile(qwen) or not os.path.isdir(python_dir):
        fail(f"the text assets are not in {cache} (no {qwen} or {python_dir}); run scripts/fetch_text_assets.sh "
             "(scripts/test.sh does) or set ASYNCT_CACHE to where it put them")
    sys.path.insert(0, python_dir)
    try:
        import tokenizers
    except ImportError as e:
        fail(f"cannot import HuggingFace tokenizers from {python_dir}: {e}; run scripts/fetch_text_assets.sh")
    if tokenizers.__version__ != "0.23.3":
        fail(f"expected tokenizers 0.23.3 in {python_dir}, found {tokenizers.__version__}")
    return tokenizers, qwen


def gpt2_style(qwen_spec, add_prefix_space, digits=None):
    """digits: None, or individual_digits of a Digits step before ByteLevel (as SmolLM2's file has)."""
    spec = json.loads(json.dumps(qwen_spec))
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True,
                             "use_regex": True}
    if digits is not None:
        spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": digits}, spec["pre_tokenizer"]]}
    spec["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    next_id = max(t["id"] for t in spec["added_tokens"]) + 1
    extra = [("[MASK]", dict(lstrip=True, special=True, normalized=False)),
             ("<rs>", dict(rstrip=True, special=True, normalized=False)),
             ("word", dict(single_word=True, special=False, normalized=False)),
             ("Ωmega", dict(special=False, normalized=True)),
             ("é<x>", dict(special=False, normalized=False))]
    for i, (content, flags) in enumerate(extra):
        token = {"id": next_id + i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": False}
        token.update(flags)
        spec["added_tokens"].append(token)
    return spec


def trained_bpe(tokenizers, texts):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([tokenizers.AddedToken("zoe\u0308", normalized=True), tokenizers.AddedToken("Ωe\u0301", normalized=True)])
    spec = json.loads(tok.to_str())
    spec["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    return spec


def id_lists(reference, texts, seed):
    rng = random.Random(seed)
    vocab = reference.get_vocab_size(with_added_tokens=True)
    lists = [[rng.randrange(vocab) for _ in range(rng.randint(1, 30))] for _ in range(60)]
    for text in ["😀👍🏽 你好", "Привет e\u0301", "안녕 ✓"]:
        ids = reference.encode(text, add_special_tokens=True).ids
        lists += [ids[1:], ids[:-1], ids[::2], ids[1::2]]
    return [l for l in lists if l]


def check_file(tokenizers, tool, name, path, texts, round_trips, normalizes, failures):
    reference = tokenizers.Tokenizer.from_file(path)
    lists = id_lists(reference, texts, 99)
    run = subprocess.run([tool, path], input=json.dumps({"texts": texts, "id_lists": lists}), capture_output=True,
                         text=True, encoding="utf-8")
    if run.returncode != 0:
        failures.append(f"{name}: the tool failed ({run.returncode}): {run.stderr.strip()}")
        return
    reply = json.loads(run.stdout)
    bad = 0
    for i, text in enumerate(texts):
        expected = reference.encode(text, add_special_tokens=True).ids
        ours = reply["encoded"][i]
        problems = []
        if ours != expected:
            k = next((j for j in range(min(len(ours), len(expected))) if ours[j] != expected[j]),
                     min(len(ours), len(expected)))
            problems.append(f"ids differ at {k}: ours {ours[max(0, k - 3):k + 5]} "
                            f"({[reference.id_to_token(t) for t in ours[max(0, k - 3):k + 5]]}), "
                            f"reference {expected[max(0, k - 3):k + 5]} "
                            f"({[reference.id_to_token(t) for t in expected[max(0, k - 3):k + 5]]})")
        hf_decoded = reference.decode(expected, skip_special_tokens=False)
        if reply["decoded"][i] != hf_decoded:
            problems.append(f"decode {reply['decoded'][i][:80]!r} != reference {hf_decoded[:80]!r}")
        if reply["streamed"][i] != reply["decoded"][i] or not reply["stream_pieces_valid"][i]:
            problems.append("the streamed pieces do not add up to decode(ids)")
        round_trip = unicodedata.normalize("NFC", text) if normalizes else text
        if i < round_trips and reply["decoded"][i] != round_trip:
            problems.append(f"decode(encode(x)) = {reply['decoded'][i][:80]!r}")
        if problems:
            bad += 1
            failures.append(f"{name}: text {i} {text[:60]!r}: " + "; ".join(problems))
    bad_lists = 0
    for i, ids in enumerate(lists):
        expected = reference.decode(ids, skip_special_tokens=False)
        if reply["decoded_lists"][i] != expected or reply["streamed_lists"][i] != expected:
            bad_lists += 1
            failures.append(f"{name}: id list {ids}: decode {reply['decoded_lists'][i]!r}, streamed "
                            f"{reply['streamed_lists'][i]!r}, reference {expected!r}")
    total = sum(len(t.encode("utf-8")) for t in texts)
    print(f"{name}: {len(texts) - bad}/{len(texts)} texts ({total} bytes) match, "
          f"{len(lists) - bad_lists}/{len(lists)} id lists decode alike")


def check_cli(asynct, reference, qwen_path, failures):
    """`asynct tokenize` (--tokenizer and --model) against the reference, and --decode back."""
    # Each run loads the 7 MB file (~0.7 s): two texts, the second in one run through --model.
    texts = ["Hello <|im_start|>wörld 你好\n  x\r\n\te\u0301 👨\u200d👩\u200d👧 ", golden_corpus.PYTHON_CODE]
    for k, text in enumerate(texts):
        expected = reference.encode(text).ids
        flag, where = ("--tokenizer", qwen_path) if k == 0 else ("--model", os.path.dirname(qwen_path))
        run = subprocess.run([asynct, "tokenize", flag, where], input=text.encode(), capture_output=True)
        ours = run.stdout.decode().split()
        if run.returncode != 0 or ours != [str(i) for i in expected] or not run.stdout.endswith(b"\n"):
            failures.append(f"asynct tokenize {flag}: {text[:40]!r}: exit {run.returncode}, "
                            f"{run.stdout[:200]!r} {run.stderr[:200]!r}, reference {expected[:20]}")
        back = subprocess.run([asynct, "tokenize", "--decode", "--tokenizer", qwen_path],
                              input=" ".join(map(str, expected)).encode(), capture_output=True)
        if back.returncode != 0 or back.stdout.decode() != unicodedata.normalize("NFC", text):
            failures.append(f"asynct tokenize --decode: {text[:40]!r}: exit {back.returncode}, {back.stdout[:200]!r}")
    skip = subprocess.run([asynct, "tokenize", "--decode", "--skip-special", "--tokenizer", qwen_path],
                          input=b"151644 9707\n151645", capture_output=True)
    if skip.stdout != b"Hello":
        failures.append(f"asynct tokenize --decode --skip-special gave {skip.stdout!r}")
    print(f"asynct tokenize: {len(texts)} texts checked")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", required=True, help="the asynct_tokenizer_tool binary")
    parser.add_argument("--asynct", help="the asynct binary: also check `asynct tokenize`")
    parser.add_argument("--cache", required=True, help="scripts/fetch_text_assets.sh's cache directory")
    args = parser.parse_args()
    tokenizers, qwen_path = load_reference(args.cache)
    texts = golden_corpus.corpus()
    failures = []
    with open(qwen_path, encoding="utf-8") as f:
        qwen_spec = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        # (name, file, texts that must come back from decode(encode(x)), normalizes): a prefix
        # space comes back as an extra space, and the added tokens made for the GPT-2-style
        # files strip spaces or hold characters the byte-level decoder maps to bytes.
        files = [("qwen3", qwen_path, len(texts), True)]
        for prefix in (False, True):
            path = os.path.join(tmp, f"gpt2_prefix_{prefix}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(gpt2_style(qwen_spec, prefix), f)
            files.append((f"gpt2-style (add_prefix_space={prefix})", path, 0 if prefix else len(texts), False))
        for individual in (True, False):
            path = os.path.join(tmp, f"gpt2_digits_{individual}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(gpt2_style(qwen_spec, False, digits=individual), f)
            files.append((f"gpt2-style with Digits (individual_digits={individual})", path, len(texts), False))
        path = os.path.join(tmp, "trained.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(trained_bpe(tokenizers, texts), f)
        files.append(("small trained BPE", path, len(texts), True))
        for name, path, round_trips, normalizes in files:
            extra = ["word here", "a word", "sword words", "[MASK] x  [MASK]", "x<rs>  y", "Ωmega Ωmegas",
                     "é<x>", "zoe\u0308 zoë", "Ωé Ωe\u0301", "Ⅻ ½ x² 12ab345 ٣4 ⑩1"]
            check_file(tokenizers, args.tool, name, path, texts + extra, round_trips, normalizes, failures)
    if args.asynct:
        check_cli(args.asynct, tokenizers.Tokenizer.from_file(qwen_path), qwen_path, failures)
    if failures:
        for line in failures[:40]:
            print(line, file=sys.stderr)
        fail(f"{len(failures)} mismatches with HuggingFace tokenizers")
    print("tokenizer_golden: all match")


if __name__ == "__main__":
    main()
