"""The golden test's corpus: scripts, code, emoji, combining marks, every kind of Unicode
whitespace, digits, special tokens in text, contractions, very long words, and seeded random
text and id lists. Shared by tests/text/tokenizer_golden.py and bench/bench_tokenizer.py."""
import random

PYTHON_CODE = '''def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


if __name__ == "__main__":
    print([fib(i) for i in range(20)])  # 0 1 1 2 3 5 ...
'''

CPP_CODE = '''#include <vector>
template <typename T>
struct Stack {
  std::vector<T> items;
  void push(const T& x) { items.push_back(x); }
  T pop() { T x = items.back(); items.pop_back(); return x; }
};
int main() { Stack<int> s; s.push(42); return s.pop() != 42; }  // -> 0
'''

JSON_TEXT = '{"name": "asynct", "version": [1, 2, 3], "nested": {"k": null, "ok": true, "pi": 3.14159e+00}, "s": "a\\"b\\\\c"}'

TEXTS = [
    "", " ", "a", "Hello world", "Hello, world! How are you today?",
    # Latin with accents, Cyrillic, Greek, Arabic, Hebrew, Devanagari, Thai, CJK, Korean
    "Héllo wörld àéîõü ñ ç Œuvre façade naïve Ærø Ångström Łódź Dvořák",
    "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Καλημέρα κόσμε! ΑΒΓΔΕ αβγδε άέήίόύώ ΐΰ",
    "مرحبا بالعالم، كيف حالك؟ هذا نص عربي مع أرقام ١٢٣٤٥.",
    "שלום עולם! זהו טקסט בעברית עם ניקוד: בְּרֵאשִׁית",
    "नमस्ते दुनिया, यह एक परीक्षण है। हिन्दी में क़ ख़ ग़",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "日本語のテキスト、カタカナとひらがな。漢字も使います。ｶﾀｶﾅ",
    "안녕하세요 세계! 한국어 텍스트입니다. 감사합니다.",
    # code
    PYTHON_CODE, CPP_CODE, JSON_TEXT,
    # emoji and ZWJ sequences, flags, skin tones, variation selectors
    "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇺🇸🇯🇵 😀😃😄 🧑🏿‍💻 a😀b",
    # combining marks, text NFC changes (decomposed accents, Angstrom sign, Hangul jamo)
    "e\u0301 a\u0300 o\u0308 n\u0303 A\u030a c\u0327a u\u0308ber",
    "cafe\u0301 re\u0301sume\u0301 \u212b \u1100\u1161\u11a8 \u1e9b\u0323 q\u0307\u0323 \u0915\u093c \u2126",
    "\u0301 leading combining mark, x\u0301\u0302\u0303\u0304 stacked",
    # whitespace of every kind
    "a\tb\nc\r\nd\u00a0e\u3000f\u200bg\u2028h\u2029i\u0085j\u1680k\u2003l\u202fm\u205fn\ufeffo\u180ep\u000bq\u000cr",
    "  \n\n  \t\t \r\n\r\n   x", "x   ", "   x", "     ", "\n", "\r\n", "\n\n\n\n", "\t\t\t",
    "line one\nline two\n\n  indented\n\ttabbed\r\nwindows\r\n",
    "word \u00a0\u00a0 word \u3000\u3000 word \u2009thin",
    # digits and long runs of spaces
    "1234567890" * 10, "3.14159 2,000,000 -42 1e10 0x1F ١٢٣ ४५६ 一二三 ①②③",
    " " * 100 + "x", "x" + " " * 77 + "y", "\n" * 50, "a" + "\t" * 33 + "b",
    # special tokens inside text
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text", "<|im_start|><|im_end|><|endoftext|>", "< |im_start| >", "<|im_start",
    "<think>\nLet me reason.\n</think>\n\nAnswer", "<tool_call>{\"a\": 1}</tool_call>", " <|endoftext|> ",
    "x<|endoftext|>e\u0301", "e\u0301<|endoftext|>\u0301",
    # contractions, upper and mixed case (the (?i:...) part)
    "it's I'll we've they're I'm he'd don't can't",
    "IT'S I'LL WE'VE THEY'RE I'M HE'D DON'T It'S We'Ve",
    "'s 's 'S 'll 'LL x's x'S 'ſ 'ﬅ", "'''quoted''' \"double\" `back`",
    # very long words
    "a" * 500, "supercalifragilisticexpialidocious" * 20, "abcdefghij" * 100, "ab" * 300,
    "https://example.com/a/very/long/path?with=query&and=more#fragment" * 5,
    "😀" * 100, "你好世界" * 125, "Ж" * 300, "e\u0301" * 100,
    "".join(chr(0x41 + (i * 7) % 26) for i in range(1000)),
]


def random_texts(count, seed):
    """Seeded random strings over a mix of scripts, marks, spaces, digits and punctuation."""
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789", " \t\n\r\u00a0\u3000\u2003\u200b", ".,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`",
        "\u0301\u0300\u0308\u0327\u0303\u093c", "éàüöñçøß", "абвгдежзийклмнопрстуфхцчшщъыьэюя",
        "αβγδεζηθ", "你好世界中文字", "안녕하세요", "😀👍🏽❤️\u200d🔥", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
        "\u0928\u092e\u0938\u094d\u0924\u0947", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    ]
    out = []
    for _ in range(count):
        length = rng.randint(1, 80)
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(length)))
    return out


def corpus(seed=1234):
    texts = list(TEXTS) + random_texts(200, seed)
    texts.append("\n".join(TEXTS))  # everything at once
    return texts
