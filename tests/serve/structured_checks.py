"""Structured output through the OpenAI client (test_server.py calls it): json_schema requests of
varied schemas, whose outputs must validate with jsonschema, and json_object requests, whose
outputs must parse as JSON objects. The tiny model's tokens are random, so only the grammar makes
them valid. Every string is bounded (maxLength or enum) and max_tokens generous, so that a random
walk through the grammar ends well within it."""
import json

S = {"type": "string", "maxLength": 8}
SCHEMAS = [
    {"type": "object", "properties": {"name": S}, "required": ["name"]},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5},
                                                                                "y": {"type": "integer", "minimum": -5, "maximum": 5}},
                                                "required": ["x", "y"]}}, "required": ["point"]},
    {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9999}, "label": S}, "required": ["id", "label"]},
    {"type": "object", "properties": {"scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 10},
                                                 "minItems": 1, "maxItems": 4}}, "required": ["scores"]},
    {"type": "object", "properties": {"status": {"enum": ["open", "closed"]}, "count": {"type": "integer", "minimum": 0, "maximum": 50}},
     "required": ["status", "count"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"name": S, "admin": {"type": "boolean"}},
                                               "required": ["name", "admin"]}}, "required": ["user"]},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2,
                                                "items": {"type": "object", "properties": {"sku": S, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                                                          "required": ["sku", "qty"]}}}, "required": ["items"]},
    {"type": "object", "properties": {"level": {"type": "integer", "enum": [1, 2, 3]}}, "required": ["level"]},
    {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "boolean"}, "c": {"type": "boolean"}},
     "required": ["a", "b", "c"]},
    {"type": "object", "properties": {"kind": {"const": "event"}, "day": {"enum": ["mon", "tue", "wed"]}}, "required": ["kind", "day"]},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2,
                                                 "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3}, "maxItems": 2}}},
     "required": ["matrix"]},
    {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 6}}, "required": ["note"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["code"]},
    {"type": "object", "properties": {"outer": {"type": "object", "properties": {"inner": {"type": "object", "properties": {
        "leaf": {"enum": ["x", "y"]}}, "required": ["leaf"]}}, "required": ["inner"]}}, "required": ["outer"]},
    {"type": "object", "properties": {"temperature": {"type": "integer", "minimum": -40, "maximum": 60}, "unit": {"enum": ["C", "F"]}},
     "required": ["temperature", "unit"]},
    {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
]


def check_structured_output(client, c, jsonschema, token_ids):
    """token_ids(text): the text's token ids (/tokenize). Returns the number of requests it made."""
    for i, schema in enumerate(SCHEMAS):
        fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
        if i % 2:
            got = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"Answer {i}"}], max_tokens=160,
                                                 temperature=1.0, seed=i, response_format=fmt)
            text, reason = got.choices[0].message.content, got.choices[0].finish_reason
        else:
            got = client.completions.create(model="tiny", prompt=f"Answer {i}:", max_tokens=160, temperature=1.0 if i % 4 else 0,
                                            seed=i, extra_body={"response_format": fmt})
            text, reason = got.choices[0].text, got.choices[0].finish_reason
        try:
            jsonschema.validate(json.loads(text), schema)
            valid = True
        except (ValueError, jsonschema.ValidationError) as e:
            valid = f"{type(e).__name__}: {str(e)[:80]}"
        c.equal(f"json_schema {i}: {text[:60]!r} validates, finish_reason stop", (valid, reason), (True, "stop"))
    # json_object: any object, whose keys and strings a random model would rarely close; a logit
    # bias towards the closing tokens (biases and masks together) ends it within max_tokens.
    closing = {str(i): 30 for piece in ['"', '"}', '",', '":', "}"] for i in token_ids(piece)[:1]}
    for seed in range(3):
        got = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "JSON please"}], max_tokens=200,
                                             temperature=0.7, seed=seed, response_format={"type": "json_object"},
                                             logit_bias=closing)
        text = got.choices[0].message.content
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        c.equal(f"json_object {seed}: {text[:60]!r} parses as an object", (isinstance(parsed, dict), got.choices[0].finish_reason),
                (True, "stop"))
    return len(SCHEMAS) + 3
