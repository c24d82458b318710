#!/usr/bin/env python3
"""Renders chat-template cases with Python's jinja2 3.1.6, set up as HuggingFace transformers
sets it up for chat templates, and with asynct (tests/text/render_chat_template.cpp), and
compares the outputs byte for byte. A case where jinja2 raises must fail in asynct too.

Cases: the official Qwen3 template (tokenizer_config.json from scripts/fetch_text_assets.sh's
cache, --cache), SmolLM2-Instruct's template (tests/text/data/), and small
templates that exercise the interpreter's pieces one at a time.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def fail_setup(message):
    print(f"compare_chat_templates: {message}", file=sys.stderr)
    print("Run scripts/fetch_text_assets.sh (with ASYNCT_CACHE set to the cache to use).", file=sys.stderr)
    sys.exit(1)


def load_assets(assets):
    config_path = os.path.join(assets, "qwen3", "tokenizer_config.json")
    python_dir = os.path.join(assets, "python")
    if not os.path.isfile(config_path) or not os.path.isdir(python_dir):
        fail_setup(f"the cache {assets} lacks qwen3/tokenizer_config.json or python/.")
    sys.path.insert(0, python_dir)
    import jinja2  # noqa: E402  (from the cache)

    if jinja2.__version__ != "3.1.6":
        fail_setup(f"{python_dir} holds jinja2 {jinja2.__version__}, not 3.1.6.")
    with open(config_path, encoding="utf-8") as f:
        return json.load(f)


def hf_environment():
    """transformers.utils.chat_template_utils._compile_jinja_template's environment (its
    AssistantTracker extension only adds {% generation %}, which asynct does not support)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def hf_variables(config, messages, tools, add_generation_prompt, extra):
    """What apply_chat_template passes: messages, tools, documents, add_generation_prompt,
    **special_tokens_map (the set ones, as strings), **kwargs."""
    special = {}
    for name in ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]:
        token = config.get(name)
        if isinstance(token, dict):
            token = token.get("content")
        if token:
            special[name] = token
    additional = [t["content"] if isinstance(t, dict) else t for t in config.get("additional_special_tokens") or []]
    if additional:
        special["additional_special_tokens"] = additional
    return dict(messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt,
                **{**special, **extra})


# --- cases -----------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Das Wetter für einen Ort — \"aktuell\".",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "Stadt, z. B. München 🌧"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14.5},
            },
            "required": ["location"],
        },
    },
}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search.\nTwo lines\ttab",
                                           "parameters": {"type": "object", "properties": {}}}}


def chat_cases(name, config):
    u = lambda text: {"role": "user", "content": text}  # noqa: E731
    a = lambda text, **kw: {"role": "assistant", "content": text, **kw}  # noqa: E731
    s = {"role": "system", "content": "You are terse. «Quotes» 'and' \"more\" \\ backslash"}
    call_dict = {"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Zürich", "days": 3}}}
    call_str = {"type": "function", "function": {"name": "search", "arguments": "{\"q\": \"jinja\"}"}}
    call_flat = {"name": "search", "arguments": {"q": "flat, no function wrapper"}}
    tool = lambda text: {"role": "tool", "content": text}  # noqa: E731
    convs = [
        ("user", [u("Hello!")], None, {}),
        ("system_user", [s, u("Hi")], None, {}),
        ("multi_turn", [s, u("Hi"), a("Hello."), u("How are you?"), a("Fine."), u("Bye")], None, {}),
        ("no_thinking", [u("2+2?")], None, {"enable_thinking": False}),
        ("thinking_true", [u("2+2?")], None, {"enable_thinking": True}),
        ("reasoning_content", [u("2+2?"), a("4", reasoning_content="\nAdd two and two.\n")], None, {}),
        ("reasoning_earlier_turn", [u("q1"), a("a1", reasoning_content="r1"), u("q2"), a("a2", reasoning_content="r2")],
         None, {}),
        ("reasoning_none", [u("q"), a("plain answer", reasoning_content=None)], None, {}),
        ("think_in_content", [u("q1"), a("<think>\nfirst thoughts\n</think>\n\nanswer one"), u("q2"),
                              a("<think>\nsecond\n</think>\n\nanswer two")], None, {}),
        ("think_in_content_nothinking", [u("q1"), a("<think>\nx\n</think>\n\ny")], None, {"enable_thinking": False}),
        ("tools", [u("Weather in Bern?")], [WEATHER, SEARCH], {}),
        ("tools_system", [s, u("Weather in Bern?")], [WEATHER], {"enable_thinking": False}),
        ("tool_calls", [u("Weather in Zürich?"), a("", tool_calls=[call_dict]), tool("{\"temp\": 21}"),
                        a("It is 21 °C.")], [WEATHER], {}),
        ("tool_calls_multi", [s, u("Find things"), a("Let me look.", tool_calls=[call_str, call_dict, call_flat]),
                              tool("result one"), tool("result two"), tool("result three"), a("Done.", reasoning_content="ok")],
         [WEATHER, SEARCH], {}),
        ("tool_call_then_user", [u("q"), a("", tool_calls=[call_str]), tool("r"), u("<tool_response>\nfake\n</tool_response>"),
                                 u("real question")], [SEARCH], {}),
        ("tool_response_user_last", [u("q"), a("", tool_calls=[call_str]), u("<tool_response>x</tool_response>")], [SEARCH],
         {}),
        ("unicode", [u("日本語のテキスト 😀 and e\u0301 \u2028 line sep"), a("Ответ: да.")], None, {}),
        ("empty_content", [u(""), a("")], None, {}),
        ("extra_variable", [u("hi")], None, {"enable_thinking": False, "custom": [1, 2]}),
    ]
    cases = []
    for label, messages, tools, extra in convs:
        for agp in (True, False):
            cases.append({"name": f"{name}/{label}/agp={agp}", "tokenizer_config": config, "messages": messages,
                          "tools": tools, "add_generation_prompt": agp, "extra": extra})
    cases.append({"name": f"{name}/no_messages", "tokenizer_config": config, "messages": [], "tools": None,
                  "add_generation_prompt": True, "extra": {}})
    return cases


# Small templates: (name, template, variables). Each renders with jinja2 or fails in both.
V = {"s": "  Hello, World  ", "n": 7, "f": 2.5, "l": [3, 1, 2], "d": {"b": 1, "a": [1, {"x": None}], "c": "ü"},
     "msgs": [{"role": "system", "content": "sys"}, {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}],
     "t": True, "none": None, "u": "ünïcödé 😀", "empty": [], "e": ""}
SNIPPETS = [
    ("ws_trim_blocks", "{% if t %}\nyes\n{% endif %}\nafter\n", V),
    ("ws_lstrip", "a\n    {% if t %}\n    b\n    {% endif %}\n  {# c #}\nc", V),
    ("ws_lstrip_not_start_of_line", "x {% if t %}y{% endif %} z\n", V),
    ("ws_plus", "a\n  {%+ if t +%}\nb\n  {%- endif %}  \n", V),
    ("ws_minus", "a  \n\n  {{- s -}}  \n\n  b {%- if t -%}\n\n c {% endif -%}   \n d", V),
    ("ws_comment_minus", "x   {#- comment -#}   y\n{# c2 #}\nz", V),
    ("ws_crlf_and_trailing_newline", "a\r\n{% if t %}\r\nb\r\n{% endif %}\r\n", V),
    ("ws_two_trailing_newlines", "a\n\n", V),
    ("ws_var_no_trim", "{{ n }}\n{{ n }}\n", V),
    ("ws_tabs_lstrip", "\t\t{% if t %}x{% endif %}\n", V),
    ("print_values", "{{ n }}|{{ f }}|{{ t }}|{{ none }}|{{ l }}|{{ d }}|{{ u }}|{{ undefined_name }}|{{ 'it''s' }}", V),
    ("print_floats", "{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1.5e-5 }} {{ 0.0001 }} {{ 123456789.125 }} {{ -0.0 }} {{ 1 / 3 }} {{ 2.0 ** 70 }}", V),
    ("print_repr_quotes", "{{ ['a\\'b', \"c\\\"d\", 'both \\' \"', 'nl\\n', 'tab\\t', 'bs\\\\', 'ü', '\\x01'] }}", V),
    ("string_escapes", "{{ 'a\\tb\\u00e9\\x41\\101\\q' }}", V),
    ("tojson_default", "{{ d | tojson }} {{ u | tojson }} {{ l|tojson }} {{ 'ctl\\x01\\x7f\\n\"' | tojson }} {{ 1.5e300|tojson }}", V),
    ("tojson_options", "{{ d | tojson(indent=2) }}\n{{ d | tojson(sort_keys=true) }}\n{{ d|tojson(ensure_ascii=true) }}\n{{ u|tojson(ensure_ascii=True) }}\n{{ d|tojson(separators=[',', ':']) }}\n{{ empty|tojson(indent=4) }}{{ {}|tojson(indent=1) }}", V),
    ("tojson_indent_string", "{{ d | tojson(indent='\\t') }}", V),
    ("filters_strings", "{{ s|trim }}|{{ s|lower }}|{{ s|upper }}|{{ 'hello wORLD 1st'|title }}|{{ 'hELLO'|capitalize }}|{{ s|replace('l', 'L') }}|{{ s|replace('l', 'L', 2) }}|{{ n|string ~ '!' }}|{{ s|length }}|{{ u|length }}|{{ 'xxhixx'|trim('x') }}", V),
    ("filters_default", "{{ missing|default('dflt') }}|{{ none|default('x') }}|{{ e|default('y', true) }}|{{ missing|d }}|{{ n|default(3) }}", V),
    ("filters_lists", "{{ l|join(', ') }}|{{ l|first }}|{{ l|last }}|{{ l|length }}|{{ d|length }}|{{ d|list }}|{{ u|list }}|{{ l|reverse|list }}|{{ u|reverse }}|{{ d|items|list }}|{{ msgs|map(attribute='role')|join(',') }}|{{ l|map('string')|join }}", V),
    ("filters_select", "{{ msgs|selectattr('role', 'equalto', 'user')|list }}|{{ msgs|rejectattr('role', 'eq', 'system')|map(attribute='content')|list }}|{{ msgs|selectattr('content')|list|length }}", V),
    ("filters_numbers", "{{ '42'|int + 1 }}|{{ '3.9'|int }}|{{ 'x'|int(5) }}|{{ 3.7|int }}|{{ '2.5'|float }}|{{ n|float }}|{{ -3|abs }}|{{ (0 - 2.5)|abs }}|{{ 'x'|float }}", V),
    ("filters_safe_join_attr", "{{ 'a<b>'|safe }}|{{ msgs|join('/', attribute='role') }}|{{ d|items|map('first')|join }}", V),
    ("methods_strip_split", "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxaxx'.strip('x') }}][{{ 'a,b,,c'.split(',') }}][{{ ' a  b \\n c '.split() }}][{{ 'a b c'.split(' ', 1) }}][{{ 'a b c'.split(maxsplit=1) }}][{{ '\\n\\nx\\n'.lstrip('\\n') }}]", V),
    ("methods_search", "{{ s.startswith('  He') }} {{ s.endswith(('x', '  ')) }} {{ 'abcabc'.find('c') }} {{ 'abcabc'.rfind('c') }} {{ 'ü😀x'.find('x') }} {{ 'aXbXc'.count('X') }} {{ '-'.join(['a', 'b']) }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'ab'.replace('', '-') }} {{ 'Hi'.upper() }}{{ 'Hi'.lower() }} {{ 'a b'.title() }}", V),
    ("methods_dict", "{{ d.get('b') }} {{ d.get('zz') }} {{ d.get('zz', 'fallback') }} {{ d.keys()|list }} {{ d.values()|list }}{% for k, v in d.items() %} {{ k }}={{ v }}{% endfor %}", V),
    ("slices", "{{ l[::-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::2] }} {{ l[-1] }} {{ l[5] }} {{ u[::-1] }} {{ u[1:4] }} {{ u[-1] }} {{ s[2:7] }} {{ l[-10:10] }} {{ l[10:] }} {{ l[2:0:-1] }}", V),
    ("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1 / 2 }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] + [2] }} {{ 'x' ~ 1 ~ none ~ t }} {{ 1 + 1.5 }} {{ t + 1 }} {{ -n }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** -1 }} {{ 10 - 2 * 3 }} {{ (10 - 2) * 3 }} {{ 2 ** 3 ** 2 }}", V),
    ("logic", "{{ none or 'x' }} {{ 0 and 1 }} {{ 'a' and 'b' }} {{ not e }} {{ 1 if t }}{{ 1 if not t }}|{{ 'y' if none else 'n' }} {{ n > 3 and n < 10 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ t == 1 }} {{ 'u1' in msgs|map(attribute='content') }} {{ 'ell' in s }} {{ 'b' in d }} {{ 'zz' not in d }} {{ 3 in l }} {{ none == none }} {{ missing == missing }} {{ missing != 1 }}", V),
    ("tests", "{{ n is number }} {{ t is number }} {{ n is integer }} {{ t is integer }} {{ f is float }} {{ t is boolean }} {{ t is true }} {{ t is false }} {{ none is none }} {{ s is string }} {{ d is mapping }} {{ l is iterable }} {{ s is sequence }} {{ d is sequence }} {{ missing is iterable }} {{ missing is sequence }} {{ missing is defined }} {{ missing is undefined }} {{ n is not none }} {{ n is odd }} {{ l|length is even }} {{ 9 is divisibleby 3 }} {{ n is eq 7 }} {{ n is ne(7) }} {{ 2 is in l }} {{ none is sameas none }} {{ n is gt 3 }} {{ n is lt(3) }}", V),
    ("loop_vars", "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}[{{ loop.previtem }}|{{ loop.nextitem }}] {% endfor %}", V),
    ("loop_filter_else", "{% for m in msgs if m.role != 'system' %}{{ loop.index }}:{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %}|{% for x in empty %}x{% else %}empty{% endfor %}|{% for x in l if x > 10 %}x{% else %}none kept{% endfor %}", V),
    ("loop_controls", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", V),
    ("loop_nested", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }};{% endfor %}", V),
    ("loop_over_dict_and_string", "{% for k in d %}{{ k }}{% endfor %}|{% for c in u %}[{{ c }}]{% endfor %}|{% for x in missing %}x{% endfor %}", V),
    ("loop_unpack", "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }} {% endfor %}{% for (k, v) in d|items %}{{ k }}{% endfor %}", V),
    ("range", "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }}", V),
    ("set_scoping", "{% set x = 1 %}{% for i in l %}{% set x = i %}{{ x }}{% endfor %}|{{ x }}|{% if t %}{% set y = 5 %}{% endif %}{{ y }}", V),
    ("set_in_loop_reads_outer", "{% set x = 'outer' %}{% for i in [1, 2] %}{{ x }}{% set x = 'inner' ~ i %}{{ x }} {% endfor %}{{ x }}", V),
    ("set_in_loop_undefined_first", "{% for i in [1, 2] %}[{{ z }}]{% set z = i %}{{ z }}{% endfor %}", V),
    ("namespace", "{% set ns = namespace(count=0, found=none) %}{% for m in msgs %}{% set ns.count = ns.count + 1 %}{% if m.role == 'user' %}{% set ns.found = m.content %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }} {{ ns.missing is defined }}", V),
    ("set_block_and_tuple", "{% set block %}a{{ n }}b{% endset %}{{ block }}|{% set p, q = [1, 2] %}{{ p }}{{ q }}|{% set lst = ['x', n, {'k': l}] %}{{ lst }}", V),
    ("dict_literal_in_tag", "{{ {'a': {'b': 1}} }}{{ {'a': {'b': 1}}['a'] }}", V),
    ("undefined_behaviour", "[{{ missing }}][{{ missing|length }}][{{ missing ~ 'x' }}][{{ d.zz }}][{{ d['zz'] }}][{{ none.x }}][{{ l.x }}][{{ msgs[0].nope }}][{{ (missing|default({})).x }}]", V),
    ("conditional_chain", "{% if n < 5 %}small{% elif n < 10 %}medium{% else %}large{% endif %}|{% if missing %}a{% elif e %}b{% else %}c{% endif %}", V),
    ("string_concat_in_test", "{% if (s ~ 'x').endswith('x') and not s.startswith('x') %}ok{% endif %}", V),
    ("adjacent_string_literals", "{{ 'a' 'b' \"c\" }}", V),
    ("integer_attribute", "{{ l.0 }}{{ msgs.1.role }}", V),
    ("bos_eos_like_vars", "{{ bos_token }}{% for m in messages %}{{ m.content + eos_token }}{% endfor %}", {"messages": [{"content": "a"}], "bos_token": "<s>", "eos_token": "</s>"}),
    ("python_shapes", "{{ d.items() }} {{ d.keys() }} {{ d.values() }} {{ (1, 2) }} {{ (1,) }} {{ () }} {{ [(1, 2), (3, 4)] }} {{ (d|items|list)[0] }} {{ d.items()|length }} {{ (1, 2) == [1, 2] }} {{ l|reverse|list }} {{ 'a-b (c) x_y'|title }} {{ d.items()|list|last }}", V),
    ("generator_truthiness", "{% if msgs|selectattr('role', 'eq', 'tool') %}always true{% endif %}|{% if msgs|selectattr('role', 'eq', 'tool')|list %}never{% endif %}|{{ msgs|selectattr('role', 'eq', 'user')|first }}", V),
    ("generator_in_loop", "{% set tools_used = msgs|map(attribute='role') %}{% for r in tools_used %}{{ loop.index }}{{ r }} {% endfor %}|{{ 'user' in msgs|map(attribute='role') }}", V),
    # Failures: jinja2 raises, asynct must raise too.
    ("error_generator_length", "{{ msgs|selectattr('role')|length }}", V),
    ("error_generator_last", "{{ msgs|map(attribute='role')|last }}", V),
    ("error_tojson_generator", "{{ msgs|map(attribute='role')|tojson }}", V),
    ("error_raise_exception", "{{ raise_exception('Only user and assistant roles are supported!') }}", V),
    ("error_undefined_attribute", "{{ missing.attr }}", V),
    ("error_undefined_plus", "{{ missing + 'x' }}", V),
    ("error_none_plus_string", "{{ none + 'x' }}", V),
    ("error_string_plus_int", "{{ 'a' + 1 }}", V),
    ("error_compare_types", "{{ 1 < 'a' }}", V),
    ("error_iterate_number", "{% for x in n %}{% endfor %}", V),
    ("error_division_by_zero", "{{ 1 / 0 }}", V),
    ("error_tojson_undefined", "{{ missing|tojson }}", V),
    ("error_unclosed_if", "{% if t %}x", V),
    ("error_unknown_filter", "{{ s|nosuchfilter }}", V),
    ("error_messages_empty", "{{ messages[0].role }}", {"messages": []}),
]


# Constructs asynct refuses: jinja2 renders them, asynct must fail with an "unsupported" error
# rather than render something else.
REFUSED = [
    ("macro", "{% macro f(x) %}[{{ x }}]{% endmacro %}{{ f(1) }}", V),
    ("generator_used_twice", "{% set g = msgs|map(attribute='role') %}{{ g|join }}|{{ g|join }}", V),
    ("printing_a_generator", "{{ msgs|map(attribute='role') }}", V),
    ("string_format", "{{ '%s!' % s }}", V),
    ("non_ascii_case", "{{ 'Émile'|lower }}", V),
    ("dict_method_as_attribute", "{{ d.items is defined }}", V),
    ("chained_comparison", "{{ 1 < n < 10 }}", V),
    ("loop_cycle", "{% for x in l %}{{ loop.cycle('a', 'b') }}{% endfor %}", V),
]


def refused_cases():
    return [{"name": f"refused/{name}", "template": template, "variables": variables, "refused": True}
            for name, template, variables in REFUSED]


def snippet_cases():
    return [{"name": f"snippet/{name}", "template": template, "variables": variables}
            for name, template, variables in SNIPPETS]


def render_jinja(env, case, configs):
    import jinja2

    try:
        if "template" in case:
            return True, env.from_string(case["template"]).render(**case["variables"])
        config = case["tokenizer_config"]
        variables = hf_variables(config, case["messages"], case["tools"], case["add_generation_prompt"], case["extra"])
        return True, env.from_string(config["chat_template"]).render(**variables)
    except (jinja2.TemplateError, TypeError, ValueError, ZeroDivisionError, AttributeError) as e:
        return False, f"{type(e).__name__}: {e}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--renderer", required=True, help="the render_chat_template binary")
    parser.add_argument("--cache", default=os.environ.get("ASYNCT_CACHE", os.path.expanduser("~/.cache/asynct")),
                        help="scripts/fetch_text_assets.sh's cache")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()

    qwen3 = load_assets(args.cache)
    with open(os.path.join(HERE, "data", "smollm2_tokenizer_config.json"), encoding="utf-8") as f:
        smollm2 = json.load(f)
    cases = chat_cases("qwen3", qwen3) + chat_cases("smollm2", smollm2) + snippet_cases() + refused_cases()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cases.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump([{k: v for k, v in c.items() if k not in ("name", "refused")} for c in cases], f, ensure_ascii=False)
        run = subprocess.run([args.renderer, path], capture_output=True, text=True, encoding="utf-8")
    if run.returncode != 0:
        print(run.stderr, file=sys.stderr)
        sys.exit(f"compare_chat_templates: {args.renderer} exited with {run.returncode}")
    results = json.loads(run.stdout)
    assert len(results) == len(cases)

    env = hf_environment()
    failures = 0
    counts = {"identical": 0, "both_failed": 0, "refused": 0}
    for case, got in zip(cases, results):
        ok, expected = render_jinja(env, case, None)
        if case.get("refused"):
            if ok and not got["ok"] and ("unsupported" in got["error"] or "not supported" in got["error"]):
                counts["refused"] += 1
                if args.verbose:
                    print(f"refused: {case['name']}\n  asynct: {got['error']}")
            else:
                failures += 1
                print(f"NOT REFUSED {case['name']}: jinja2 {'ok' if ok else 'error'}, asynct "
                      f"{repr(got['text']) if got['ok'] else got['error']}")
            continue
        if ok and got["ok"] and got["text"] == expected:
            counts["identical"] += 1
            continue
        if not ok and not got["ok"]:
            counts["both_failed"] += 1
            if args.verbose:
                print(f"both failed: {case['name']}\n  jinja2: {expected}\n  asynct: {got['error']}")
            continue
        failures += 1
        print(f"MISMATCH {case['name']}")
        print(f"  jinja2: {'ok ' + repr(expected) if ok else 'error ' + expected}")
        print(f"  asynct: {'ok ' + repr(got['text']) if got['ok'] else 'error ' + got['error']}")
    print(f"{len(cases)} cases: {counts['identical']} rendered identically, {counts['both_failed']} failed in both "
          f"(as they should), {counts['refused']} refused as unsupported (as they should), {failures} mismatched")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
