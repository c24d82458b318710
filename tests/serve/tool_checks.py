"""Tool calls through the OpenAI client (test_server.py calls it, for a build with xgrammar): forced
calls (tool_choice required and named), whole and streamed (the client's stream helper assembles
the deltas), whose arguments must validate with jsonschema against the function's parameters;
the calls sent back with their results in the next request; tools shown to the model (its prompt
grows) unless tool_choice is none. The tiny model's tokens are random, so only the grammar makes a
call; every string argument is bounded so that a random walk ends well within max_tokens. The
model's own choice ("auto") is read from its text by the unit tests (test_tool_calls.cpp).

check_tool_calls runs on the test's SmolLM2-tokenizer model, whose template has no section for
tools (the server writes them into the system message); check_qwen3_tool_calls on a tiny model
with Qwen3's tokenizer and template, which renders them itself and has <tool_call> as one token."""
import json
import os

from server_harness import TIMEOUT, Server, raw, write_tiny_llama

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Bern", "Oslo", "Lima"]},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 8},
                                                    "limit": {"type": "integer", "minimum": 1, "maximum": 5}},
                   "required": ["query", "limit"]}}}
CLOCK = {"type": "function", "function": {"name": "clock", "description": "The time now."}}
TOOLS = [WEATHER, SEARCH, CLOCK]
PARAMETERS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in TOOLS}
QUESTION = [{"role": "user", "content": "What is the weather in Bern?"}]


def valid_call(c, jsonschema, label, message, finish_reason, names):
    """The message's only call, checked (its arguments against its function's parameters); None if it fails."""
    calls = message.tool_calls or []
    ok = len(calls) == 1 and calls[0].type == "function" and calls[0].function.name in names and calls[0].id.startswith("call_")
    if ok:
        try:
            jsonschema.validate(json.loads(calls[0].function.arguments), PARAMETERS[calls[0].function.name])
        except (ValueError, jsonschema.ValidationError) as e:
            ok = f"{type(e).__name__}: {str(e)[:80]}"
    shown = [(t.function.name, t.function.arguments[:60]) for t in calls]
    c.equal(f"{label}: {shown} is one valid call, content None, finish_reason tool_calls",
            (ok, message.content, finish_reason), (True, None, "tool_calls"))
    return calls[0] if ok is True else None


def check_forced_calls(client, c, jsonschema, seeds):
    """tool_choice required and named, whole and streamed (the client's helper assembles the deltas)."""
    for seed in seeds:
        named = TOOLS[seed % 3]["function"]["name"]
        for choice, names in (("required", PARAMETERS.keys()), ({"type": "function", "function": {"name": named}}, [named])):
            label = f"tool_choice {choice if isinstance(choice, str) else named}, seed {seed}"
            got = client.chat.completions.create(model="tiny", messages=QUESTION, tools=TOOLS, tool_choice=choice,
                                                 max_tokens=120, temperature=1.0, seed=seed)
            whole = valid_call(c, jsonschema, label, got.choices[0].message, got.choices[0].finish_reason, names)
            with client.chat.completions.stream(model="tiny", messages=QUESTION, tools=TOOLS, tool_choice=choice,
                                                max_tokens=120, temperature=1.0, seed=seed) as stream:
                final = stream.get_final_completion()
            streamed = valid_call(c, jsonschema, label + ", streamed", final.choices[0].message,
                                  final.choices[0].finish_reason, names)
            c.equal(f"{label}: streamed call = whole call",
                    streamed and (streamed.function.name, streamed.function.arguments),
                    whole and (whole.function.name, whole.function.arguments))
    return 4 * len(seeds)


def check_tool_calls(client, c, jsonschema, tokenize):
    """tokenize(body): /tokenize's answer for a body. Returns the number of requests it made."""
    requests = check_forced_calls(client, c, jsonschema, range(4))

    # The call and its result go back in the next request, as the client's objects.
    got = client.chat.completions.create(model="tiny", messages=QUESTION, tools=TOOLS, tool_choice="required",
                                         max_tokens=120, temperature=0)
    call = got.choices[0].message.tool_calls[0]
    follow_up = QUESTION + [got.choices[0].message.model_dump(exclude_none=True),
                            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})}]
    answer = client.chat.completions.create(model="tiny", messages=follow_up, tools=TOOLS, tool_choice="none", max_tokens=8,
                                            temperature=0)
    c.equal("a call and its result sent back: a text answer",
            (isinstance(answer.choices[0].message.content, str), answer.choices[0].message.tool_calls), (True, None))
    with_result = tokenize({"model": "tiny", "messages": follow_up})["count"]
    c.equal("the result is in the prompt", with_result > tokenize({"model": "tiny", "messages": QUESTION})["count"], True)
    requests += 2

    # The tools are shown to the model unless tool_choice is none; "auto" answers with whatever
    # the model writes (text from this one), never an error.
    plain = tokenize({"model": "tiny", "messages": QUESTION})["count"]
    shown = tokenize({"model": "tiny", "messages": QUESTION, "tools": TOOLS})["count"]
    hidden = tokenize({"model": "tiny", "messages": QUESTION, "tools": TOOLS, "tool_choice": "none"})["count"]
    c.equal("tools make the prompt longer unless tool_choice is none", (shown > plain + 50, hidden), (True, plain))
    auto = client.chat.completions.create(model="tiny", messages=QUESTION, tools=TOOLS, max_tokens=16, temperature=0)
    c.equal("tool_choice auto on a model that writes no call: its text",
            (auto.choices[0].finish_reason in ("length", "stop"), auto.choices[0].message.tool_calls), (True, None))
    requests += 1
    return requests


def check_qwen3_tool_calls(binary, tokenizer_dir, work, c, jsonschema, openai):
    """Qwen3's template: the tools rendered by it, forced calls valid, whole and streamed."""
    model = os.path.join(work, "tiny-qwen3")
    write_tiny_llama(model, tokenizer_dir, vocab=151936, eos_token_id=151645)  # <|im_end|> ends an answer
    with Server(binary, model) as server:
        client = openai.OpenAI(base_url=server.url(), api_key="unused", timeout=TIMEOUT, max_retries=0)
        ids = raw(server.port, "POST", "/tokenize", json.dumps({"messages": QUESTION, "tools": TOOLS}).encode())[1]["tokens"]
        prompt = raw(server.port, "POST", "/detokenize", json.dumps({"tokens": ids}).encode())[1]["prompt"]
        c.equal("Qwen3's template renders the tools itself",
                ("<tools>" in prompt, json.dumps(WEATHER, ensure_ascii=False) in prompt, "# Tools" in prompt), (True, True, True))
        check_forced_calls(client, c, jsonschema, range(2))
