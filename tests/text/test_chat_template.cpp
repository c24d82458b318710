// The chat-template interpreter's pieces (lexer whitespace rules, expressions, filters, scoping)
// and its errors: every unsupported or malformed construct names itself and its line:column.
// Byte-for-byte agreement with jinja2 is tests/text/compare_chat_templates.py's job.
#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "text/chat_template.h"
#include "text/jinja/value.h"

namespace asynct {
namespace {

using Json = nlohmann::ordered_json;
using testing::expect_error;

std::string render(const std::string& source, const Json& variables = Json::object()) {
  return ChatTemplate(source).render(variables);
}

TEST(ChatTemplateLexer, TrimsAndStripsAroundBlocksLikeHuggingFace) {
  EXPECT_EQ(render("{% if true %}\nyes\n{% endif %}\nafter\n"), "yes\nafter");
  EXPECT_EQ(render("a\n    {% if true %}\n    b\n    {% endif %}\nc"), "a\n    b\nc");
  EXPECT_EQ(render("x {% if true %}y{% endif %} z"), "x y z");  // not at a line start: kept
  EXPECT_EQ(render("a  \n {{- 'b' -}} \n c"), "abc");
  EXPECT_EQ(render("a\n  {%+ if true +%}\nb{% endif %}"), "a\n  \nb");
  EXPECT_EQ(render("x {#- c -#} y\n{# c #}\nz"), "xy\nz");
  EXPECT_EQ(render("a\r\nb\r\n"), "a\nb");
}

TEST(ChatTemplateExpressions, FollowPythonSemantics) {
  Json v = {{"l", {3, 1, 2}}, {"s", "h\u00e9llo"}, {"d", {{"b", 1}, {"a", nullptr}}}};
  EXPECT_EQ(render("{{ l[::-1] }} {{ l[-1] }} {{ s[1:3] }} {{ s|length }}", v), "[2, 1, 3] 2 \u00e9l 5");
  EXPECT_EQ(render("{{ -7 // 2 }} {{ 7 % -3 }} {{ 1 / 2 }} {{ 2 ** 10 }} {{ 'ab' * 2 }}"), "-4 -2 0.5 1024 abab");
  EXPECT_EQ(render("{{ d }} {{ none or 'x' }} {{ 0 and 1 }} {{ true }} {{ 1e16 }} {{ 0.1 + 0.2 }}", v),
            "{'b': 1, 'a': None} x 0 True 1e+16 0.30000000000000004");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }} {{ 'b' in d }} {{ 'z' not in s }} {{ 1 == 1.0 }} {{ missing }}|", v),
            "a1None True True True |");
  EXPECT_EQ(render("{{ s.startswith(('x', 'h')) }} {{ 'a,b'.split(',') }} {{ '  x '.strip() }} {{ d.get('zz', 3) }}", v),
            "True ['a', 'b'] x 3");
}

TEST(ChatTemplateFilters, TojsonMatchesPythonJsonDumps) {
  Json v = {{"d", {{"name", "f\u00fcr"}, {"n", 1.0}, {"l", Json::array()}, {"q", "a\"b\n"}}}};
  EXPECT_EQ(render("{{ d|tojson }}", v), R"({"name": "für", "n": 1.0, "l": [], "q": "a\"b\n"})");
  EXPECT_EQ(render("{{ d|tojson(ensure_ascii=true, sort_keys=true) }}", v),
            R"({"l": [], "n": 1.0, "name": "f\u00fcr", "q": "a\"b\n"})");
  EXPECT_EQ(render("{{ d|tojson(indent=2) }}", v),
            "{\n  \"name\": \"f\u00fcr\",\n  \"n\": 1.0,\n  \"l\": [],\n  \"q\": \"a\\\"b\\n\"\n}");
  EXPECT_EQ(render("{{ [1, 'x']|tojson(separators=[',', ':']) }}"), "[1,\"x\"]");
}

TEST(ChatTemplateFilters, StringsListsAndDefaults) {
  Json v = {{"m", {{{"role", "system"}}, {{"role", "user"}}}}};
  EXPECT_EQ(render("{{ m|selectattr('role', 'equalto', 'user')|list|length }} {{ m|map(attribute='role')|join('+') }}", v),
            "1 system+user");
  EXPECT_EQ(render("{{ missing|default('d') }} {{ ''|default('e', true) }} {{ ' x '|trim }} {{ 'ab'|upper }}"), "d e x AB");
  EXPECT_EQ(render("{{ {'a': 1}|items|list }} {{ 'abc'|list|first }}{{ [1, 2]|last }}"), "[('a', 1)] a2");
  // Python's shapes: tuples, dict views, and generators, which are true even when empty.
  EXPECT_EQ(render("{{ (1,) }} {{ {'a': 1}.items() }} {{ {'a': 1}.keys() }} {{ (1, 2) == [1, 2] }}"),
            "(1,) dict_items([('a', 1)]) dict_keys(['a']) False");
  EXPECT_EQ(render("{% if []|selectattr('x') %}true{% endif %}"), "true");
  expect_error([] { render("{{ [1]|map('string')|length }}"); }, "object of type 'generator' has no len()");
  expect_error([] { render("{% set g = [1]|map('string') %}{{ g|join }}{{ g|join }}"); }, "using a generator");
}

TEST(ChatTemplateStatements, LoopsScopesAndNamespaces) {
  EXPECT_EQ(render("{% for x in [1, 2, 3] if x != 2 %}{{ loop.index }}{{ x }}{{ loop.last }} {% endfor %}"),
            "11False 23True ");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(render("{% for x in range(9) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  // A set inside a loop lives for one iteration; a namespace carries values out.
  EXPECT_EQ(render("{% set x = 0 %}{% set ns = namespace(n=0) %}{% for i in [1, 2] %}{% set x = i %}{% set ns.n = ns.n + i %}{% endfor %}{{ x }} {{ ns.n }}"),
            "0 3");
  EXPECT_EQ(render("{% set a %}in{{ 1 }}{% endset %}{{ a }}"), "in1");
  EXPECT_EQ(render("{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}"), "a=1");
}

TEST(ChatTemplateErrors, NameTheConstructAndItsPosition) {
  expect_error([] { render("{% macro f() %}{% endmacro %}"); }, "line 1:4: unsupported statement '{% macro %}'");
  expect_error([] { render("a\n{% include 'x' %}"); }, "line 2:4: unsupported statement '{% include %}'");
  expect_error([] { render("{{ x|wordcount }}"); }, "line 1:5: unsupported filter 'wordcount'");
  expect_error([] { render("{{ x is callable }}"); }, "unsupported test 'callable'");
  expect_error([] { render("{{ 'a'.format(1) }}"); }, "unsupported string method 'format'");
  expect_error([] { render("{{ lipsum() }}"); }, "unsupported function 'lipsum()'");
  expect_error([] { render("{% for x in [1] recursive %}{% endfor %}"); }, "unsupported: recursive for loops");
  expect_error([] { render("{% for x in [1] %}{{ loop.cycle('a', 'b') }}{% endfor %}"); }, "unsupported: loop.cycle()");
  expect_error([] { render("{{ 1 < 2 < 3 }}"); }, "unsupported: chained comparisons");
  expect_error([] { render("{{ '%s' % 1 }}"); }, "unsupported: printf-style string formatting");
  expect_error([] { render("{{ 'É'|lower }}"); }, "changing the case of non-ASCII text is not supported (U+00C9)");
  expect_error([] { render("{{ {'items': 1}.items }}"); }, "'.items' on a mapping is the dict method");
  expect_error([] { render("{% set x = 1 %}{% set x.y = 2 %}"); }, "needs a namespace()");
}

TEST(ChatTemplateErrors, ReportsTemplateMistakesAndRuntimeFailures) {
  expect_error([] { render("{% if true %}x"); }, "missing 'elif' or 'else' or 'endif' before the end of the template");
  expect_error([] { render("{% endfor %}"); }, "unexpected 'endfor'");
  expect_error([] { render("{{ 'abc }}"); }, "line 1:4: unclosed string literal");
  expect_error([] { render("{{ x"); }, "unclosed tag '{{'");
  expect_error([] { render("{# x"); }, "unclosed comment");
  expect_error([] { render("\n  {{ raise_exception('bad role') }}"); }, "line 2:6: raise_exception: bad role");
  expect_error([] { render("{{ missing.attr }}"); }, "'missing' (undefined) has no attribute 'attr'");
  expect_error([] { render("{{ none + 'x' }}"); }, "unsupported operand types for +: 'NoneType' and 'str'");
  expect_error([] { render("{{ 1 / 0 }}"); }, "division by zero");
  expect_error([] { render("{% break %}"); }, "outside a for loop");
}

TEST(ChatTemplateValues, PythonFloatReprAndStringRepr) {
  using jinja::py_float_repr;
  EXPECT_EQ(py_float_repr(1.0), "1.0");
  EXPECT_EQ(py_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(py_float_repr(1e16), "1e+16");
  EXPECT_EQ(py_float_repr(1.5e-5), "1.5e-05");
  EXPECT_EQ(py_float_repr(0.0001), "0.0001");
  EXPECT_EQ(py_float_repr(-0.0), "-0.0");
  EXPECT_EQ(jinja::py_repr(Json::array({"it's", "a\"b", "both'\"", "\n"})), R"(["it's", 'a"b', 'both\'"', '\n'])");
}

TEST(ChatTemplateVariables, BuildsWhatTransformersPasses) {
  Json config = {{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                 {"eos_token", "</s>"},
                 {"unk_token", nullptr},
                 {"pad_token", ""},
                 {"additional_special_tokens", {"<a>", {{"content", "<b>"}}}},
                 {"chat_template", "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ tools is none }}{{ x }}"}};
  Json v = chat_template_variables(config, Json::array({{{"role", "user"}, {"content", "hi"}}}), nullptr, true, {{"x", 1}});
  EXPECT_EQ(v["bos_token"], "<s>");
  EXPECT_FALSE(v.contains("unk_token"));
  EXPECT_FALSE(v.contains("pad_token"));
  EXPECT_EQ(v["additional_special_tokens"], Json({"<a>", "<b>"}));
  EXPECT_TRUE(v["documents"].is_null());
  EXPECT_EQ(ChatTemplate(chat_template_source(config)).render(v), "<s>hi</s>True1");
  Json named = {{"chat_template", {{{"name", "default"}, {"template", "d"}}, {{"name", "tool_use"}, {"template", "t"}}}}};
  EXPECT_EQ(chat_template_source(named, "tool_use"), "t");
  expect_error([] { chat_template_source(Json::object()); }, "has no chat_template");
}

}  // namespace
}  // namespace asynct
