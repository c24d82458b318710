// Splits a template into text and tag tokens the way jinja2's lexer does with HuggingFace's
// settings: trim_blocks (the newline after a block or comment tag is dropped), lstrip_blocks
// (spaces and tabs before a block or comment tag at the start of a line are dropped),
// `{%- -%}` / `{{- -}}` / `{#- -#}` strip all whitespace on that side, `{%+` and `+%}` turn
// lstrip/trim off for one tag. Newlines are normalised to \n and one trailing newline of the
// source is dropped (keep_trailing_newline=False).
#pragma once

#include <string>
#include <vector>

namespace asynct::jinja {

struct Pos {
  int line = 1;
  int column = 1;
};

// "line L:C" for messages.
std::string describe(Pos pos);

struct Token {
  enum class Type { Text, VariableBegin, VariableEnd, BlockBegin, BlockEnd, Name, String, Integer, Float, Operator, End };
  Type type;
  std::string value;  // text, name, decoded string literal, number or operator
  Pos pos;
};

std::vector<Token> tokenize(const std::string& source);

}  // namespace asynct::jinja
