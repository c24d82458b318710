"""What tests/serve/test_server.py runs `asynct serve` with: a tiny random Llama on disk, a
server on a free port (stopped on exit), plain HTTP requests and uploads for what a client
library would not send, `asynct generate` as the reference, and the checks' tally."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time

TIMEOUT = 60  # seconds for any one request
# Seconds for a server to load its model and listen: SmolLM2 on the CPU took over 60 beside
# another test loading it and a build on 2 cores.
START_TIMEOUT = 300


def write_tiny_llama(directory, tokenizer_dir, vocab=49152, eos_token_id=2):
    """A random tiny LlamaForCausalLM (bf16 safetensors) with tokenizer_dir's tokenizer files. Past
    2^22 values a tensor repeats its first 2^20 (a large vocabulary's embeddings in a second)."""
    import random
    hidden, layers, heads, kv_heads, inter = 64, 2, 4, 2, 128
    head_dim = hidden // heads
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": vocab,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": True, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": eos_token_id,
              "torch_dtype": "bfloat16"}
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                       p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                       p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                       p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                       p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                       p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                       p + "mlp.down_proj.weight": (hidden, inter)})
    rng = random.Random(5)
    header, blobs, offset = {}, [], 0
    for name, shape in shapes.items():
        count = 1
        for d in shape:
            count *= d
        if name.endswith("norm.weight"):
            values = [1.0] * count
        else:
            scale = 1.0 if "embed" in name else 0.2
            values = [rng.gauss(0.0, scale) for _ in range(min(count, 1 << 20) if count > 1 << 22 else count)]
        # bf16: the high half of each float32 (truncated; exact enough for random weights)
        raw = struct.pack(f"<{len(values)}f", *values)
        blob = b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))
        blob = (blob * (count // len(values) + 1))[:2 * count]
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        for blob in blobs:
            f.write(blob)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(directory, name))


class Server:
    """`asynct serve` on 127.0.0.1 at a free port, stopped on exit."""

    def __init__(self, binary, model, *extra, name="tiny"):
        # (stdout not inherited: a server left behind, by a test CTest killed, would hold CTest's pipe open.)
        self.process = subprocess.Popen([binary, "serve", "--model", model, "--port", "0", "--served-model-name", name,
                                         *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port, self.log = None, []
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while self.port is None:
                line = self.process.stderr.readline()
                if not line:
                    raise RuntimeError("asynct serve exited before listening:\n" + "".join(self.log))
                self.log.append(line)
                match = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", line)
                if match:
                    self.port = int(match.group(1))
                if time.monotonic() > deadline:
                    raise RuntimeError(f"asynct serve did not listen within {START_TIMEOUT} s:\n" + "".join(self.log))
        except BaseException:
            self.process.kill()  # no server outlives its test
            self.process.wait()
            raise
        threading.Thread(target=lambda: self.log.extend(self.process.stderr), daemon=True).start()

    def url(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise RuntimeError("asynct serve did not stop within a minute of SIGTERM")
        return self.process.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def raw(port, method, path, body=b"", headers=None):
    """(status, parsed JSON or text) of one plain HTTP request."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    connection.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    try:
        return response.status, json.loads(data), response
    except ValueError:
        return response.status, data.decode(errors="replace"), response


def upload(port, path, pieces, chunked=True, length=None):
    """(status, parsed JSON or text, whether the server closed the connection after it) of a POST
    whose body goes out piece by piece on a thread (chunked, or with Content-Length `length`),
    while the answer is read: a server that refuses it early may close before the rest is sent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += "Transfer-Encoding: chunked\r\n\r\n" if chunked else f"Content-Length: {length}\r\n\r\n"

    def send():
        try:
            sock.sendall(head.encode())
            for piece in pieces:
                sock.sendall(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server closed the connection: what a refusal does
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            got = sock.recv(65536)
            if not got:
                break
            data += got
        head_end = data.index(b"\r\n\r\n") + 4
        lines = data[:head_end].decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in lines[1:] if ":" in h)}
        if headers.get("transfer-encoding") == "chunked":
            while not data.endswith(b"0\r\n\r\n"):
                got = sock.recv(65536)
                if not got:
                    break
                data += got
            body, rest = b"", data[head_end:]
            while rest:
                size_line, rest = rest.split(b"\r\n", 1)
                size = int(size_line, 16)
                body, rest = body + rest[:size], rest[size + 2:]
        else:
            size = int(headers.get("content-length", "0"))
            while len(data) < head_end + size:
                got = sock.recv(65536)
                if not got:
                    break
                data += got
            body = data[head_end:head_end + size]
        closed = False
        try:
            sock.settimeout(5 if status >= 400 else 0.01)
            closed = sock.recv(1) == b""
        except ConnectionResetError:
            closed = True
        except socket.timeout:
            closed = False
    finally:
        sock.close()
    sender.join(TIMEOUT)
    try:
        return status, json.loads(body), closed
    except ValueError:
        return status, body.decode(errors="replace"), closed


def generate(binary, model, prompt, max_tokens, chat=False, extra=()):
    """What `asynct generate` prints for one text prompt (the reference for the server's text)."""
    command = [binary, "generate", "--model", model, "--prompt", prompt, "--max-tokens", str(max_tokens), *extra]
    if chat:
        command.append("--chat")
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    if result.returncode != 0:
        raise RuntimeError(f"asynct generate failed: {result.stderr}")
    return result.stdout.rstrip("\n")


class Checks:
    def __init__(self):
        self.failures = 0

    def equal(self, what, got, want):
        ok = got == want
        self.failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}" + ("" if ok else f": got {got!r}, want {want!r}"), flush=True)
