#!/usr/bin/env python3
"""Writes tests/data/tokenizer/corpus.jsonl: the tokenizer test cases, one JSON object per line
{"name": ..., "text": ...}. The cases live here, as Python literals, so that control characters,
combining marks and other invisible code points are spelled out with escapes and survive editors.

Usage: tools/tokref/make_corpus.py [OUT]   (default: tests/data/tokenizer/corpus.jsonl)

Deliberately absent: U+0085 (NEL) and U+FEFF, where JavaScript's \\s (the reference) and
Oniguruma's \\s (Hugging Face) disagree; letters assigned after Unicode 15.0 (PCRE2 10.42 and
utf8proc 2.8 know Unicode 15.0); 'ſ' / 'K' after an apostrophe (case folding differs). U+180E,
which PCRE2's \\s matches and both references do not, is present.
"""
import json
import os
import sys

PROSE = (
    "The committee met on Tuesday to review the proposal. After a long discussion, "
    "the members agreed that the budget should be revised before the next meeting; "
    "several of them noted that the figures for the third quarter were incomplete. "
    "\"We can't approve this as it stands,\" said the chair, \"but we'll look at it again.\"\n\n"
    "In the end, nobody was entirely satisfied -- which, as the secretary remarked, "
    "is usually the sign of a fair compromise.\n"
)

PYTHON = '''def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


if __name__ == "__main__":
    print([fib(i) for i in range(10)])  # [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]
'''

C_CODE = ("#include <stdio.h>\n\nint main(int argc, char **argv)\n{\n"
          "\tfor (int i = 0; i < argc; i++) {\n\t\tif (argv[i][0] == '-')\n"
          "\t\t\tcontinue;\n\t\tprintf(\"%d: %s\\n\", i, argv[i]);\n\t}\n"
          "\treturn 0;\n}\n")

CASES = [
    # English and contractions
    ("prose", PROSE),
    ("hello", "Hello world"),
    ("leading_space", " Hello world"),
    ("contractions_lower", "I'm sure we'll see they've done what you'd expect, isn't it? It's John's."),
    ("contractions_upper", "DON'T STOP. WE'LL GO. I'M HERE. THEY'RE OUT. YOU'VE WON. HE'D SAY IT'S JOHN'S."),
    ("contractions_mixed", "Don'T wE'Ll i'M tHeY'rE yOu'Ve hE'd It'S"),
    ("apostrophes_odd", "'s 't 're ''s '''ll rock 'n' roll 'twas o'clock' ' s"),
    ("quotes_curly", "\u201cSmart quotes\u201d and \u2018single\u2019 ones \u2014 it\u2019s fine\u2026"),
    # Unicode letters, accents, normalization
    ("accents_nfc", "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe \u00c5ngstr\u00f6m"),
    ("accents_nfd", "cafe\u0301 nai\u0308ve re\u0301sume\u0301 u\u0308ber A\u030angstro\u0308m"),
    ("combining_uncomposable", "q\u0307 x\u0323\u0302 a\u20dd \u0915\u094d\u0937"),
    ("singleton_nfc", "\u212b \u2126 \u00c5 \u03a9 \u212a"),
    ("hangul_jamo", "\u1112\u1161\u11ab\u1100\u1173\u11af \ud55c\uad6d\uc5b4"),
    ("zalgo", "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036bg\u030c\u0317\u031a\u035ao"),
    ("vietnamese", "Ti\u1ebfng Vi\u1ec7t c\u00f3 nhi\u1ec1u d\u1ea5u: \u0111\u01b0\u1eddng ph\u1ed1 H\u00e0 N\u1ed9i."),
    ("greek_cyrillic", "\u0391\u03b8\u03ae\u03bd\u03b1 \u03ba\u03b1\u03b9 \u041c\u043e\u0441\u043a\u0432\u0430: \u03a3\u03bf\u03c6\u03af\u03b1, \u043f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440!"),
    ("arabic_hebrew", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd \u0661\u0662\u0663"),
    ("devanagari_thai", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a"),
    # CJK
    ("chinese", "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002\u4f60\u89c9\u5f97\u600e\u4e48\u6837\uff1f"),
    ("japanese", "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3082\u4f7f\u3044\u307e\u3059\u3002\uff8a\uff9d\uff76\uff78"),
    ("korean", "\uc548\ub155\ud558\uc138\uc694, \uc138\uacc4! \ud55c\uad6d\uc5b4 \ud14c\uc2a4\ud2b8\uc785\ub2c8\ub2e4."),
    ("mixed_scripts", "Hello\u4e16\u754c123\u0645\u0631\u062d\u0628\u0627abc\u3053\u3093\u306b\u3061\u306f"),
    ("fullwidth", "\uff28\uff45\uff4c\uff4c\uff4f\u3000\uff37\uff4f\uff52\uff4c\uff44\uff01\uff10\uff11\uff12"),
    # Emoji
    ("emoji_simple", "I \u2764\ufe0f pizza \U0001f355 and \U0001f600\U0001f600\U0001f600!"),
    ("emoji_skin_tones", "\U0001f44d\U0001f3fb \U0001f44d\U0001f3fc \U0001f44d\U0001f3fd \U0001f44d\U0001f3fe \U0001f44d\U0001f3ff"),
    ("emoji_zwj", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 \U0001f3f3\ufe0f\u200d\U0001f308 \U0001f469\U0001f3fd\u200d\U0001f4bb"),
    ("emoji_flags_keycaps", "\U0001f1ef\U0001f1f5\U0001f1e9\U0001f1ea \U0001f1fa\U0001f1f8 1\ufe0f\u20e3 #\ufe0f\u20e3"),
    ("emoji_letters", "\U0001f680rocket a\U0001f680b \U0001f680\U0001f680x"),
    # Code
    ("python", PYTHON),
    ("c_tabs", C_CODE),
    ("json", '{"name": "strata", "version": [0, 1, 2], "ok": true, "nested": {"a": null}}\n'),
    ("html", '<div class="note">\n  <p>Hello &amp; <b>bye</b></p>\n</div>\n'),
    ("shell", "for f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}' >> out.log 2>&1\ndone\n"),
    ("regex_url", "See https://example.com/a/b?q=1&r=%20x#frag or mail me@host.org; re: ^\\s*([A-Z]+)\\d{2,}$"),
    ("markdown", "# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n* item\n  * sub-item\n\n```c\nx++;\n```\n"),
    # Whitespace
    ("spaces_runs", "a  b   c    d     e"),
    ("tabs", "\ta\t\tb\t\t\tc\t"),
    ("crlf", "line one\r\nline two\r\n\r\nline four\r\n"),
    ("cr_only", "a\rb\r\rc"),
    ("trailing_spaces", "trailing   "),
    ("leading_spaces", "    leading"),
    ("many_newlines", "top" + "\n" * 20 + "bottom"),
    ("mixed_ws", " \t \n \r\n\t\t \n  x  \n\t"),
    ("empty", ""),
    ("only_space", " "),
    ("only_newline", "\n"),
    ("spaces_1000", " " * 1000),
    ("ws_unicode", "a\u00a0b\u2009c\u3000d\u2028e\u2029f\u202fg"),
    ("ws_vt_ff", "a\x0bb\x0cc\x0b\x0c d"),
    ("ws_not_space", "a\u180eb \u180e c\u180e\u180e d\u200b e"),  # PCRE2's \s takes U+180E
    ("indent_then_word", "        return x\n    }\n}"),
    # Numbers
    ("digits", "0 1 2 3 4 5 6 7 8 9 10 99 100"),
    ("long_number", "12345678901234567890123456789012345678901234567890"),
    ("decimals", "pi = 3.14159265358979, e = 2.718281828, -0.5e-10, 1,000,000.00, $19.99, 50%"),
    ("dates_versions", "2024-01-15T08:30:00Z v1.2.3-rc.4 192.168.0.1:8080 0x7fffABCD 1e9"),
    ("numerals_other", "x\u00b2 + y\u00b3 = \u00bd, \u2160\u2161\u2162 \u216b, \u0663\u0664\u0665, \u0967\u0968\u0969, \u2460\u2461"),
    # Punctuation
    ("punct_runs", "Wait!!! Really??? Yes... no---maybe; ok: (fine) [x] {y} <z>"),
    ("punct_newlines", "end.\n\n\n---\n***\n"),
    ("symbols", "\u00a9 \u00ae \u2122 \u20ac100 \u00a3 \u00a5 \u00a7 \u00b6 \u2020 \u2021 \u2022 \u221e \u2264 \u2265 \u2260 \u00b1 \u00d7 \u00f7 \u2211 \u222b \u221a"),
    ("ascii_art", "+--------+\n|  box   |\n+--------+\n  \\o/  \n   |   \n  / \\  "),
    ("long_word", "a" * 300 + " " + "xyz" * 100),
    # Special and added tokens inline
    ("chat", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"),
    ("specials_adjacent", "<|im_end|><|im_start|><|endoftext|>"),
    ("specials_in_words", "abc<|im_start|>def<|im_end|>ghi <|endoftext|> jkl"),
    ("specials_partial", "<|im_start <|im_start| <im_start|> <|IM_START|> < |im_end| > <|unknown|>"),
    ("specials_nested", "<<|im_end|>> <|<|im_start|>|> <|im_end|||>"),
    ("user_defined_tokens", "<think>\nreasoning\n</think>\n\n<tool_call>{\"a\":1}</tool_call>"),
    ("special_then_space", "<|im_start|> user\n<|im_end|>  \n"),
    # Odd and control characters
    ("control_chars", "nul:\x00 bell:\x07 esc:\x1b[31mred\x1b[0m del:\x7f"),
    ("replacement_char", "bad \ufffd char \ufffd\ufffd"),
    ("private_use", "\ue000\uf8ff \U000f0000"),
    ("zero_width", "zero\u200bwidth\u200cnon\u200djoiner\u2060word"),
    ("bidi", "abc \u202edcba\u202c \u200fRTL mark"),
    ("surrogate_plane", "\U0001d400\U0001d401\U0001d402 \U00010348 \U0001f9ea"),
    ("empty_lines_code", "\n\n\ndef f():\n\n\n    pass\n\n"),
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        here, "..", "..", "tests", "data", "tokenizer", "corpus.jsonl")
    names = set()
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for name, text in CASES:
            if name in names:
                raise SystemExit(f"duplicate case name {name}")
            names.add(name)
            f.write(json.dumps({"name": name, "text": text}, ensure_ascii=True) + "\n")
    print(f"{out}: {len(CASES)} cases")


if __name__ == "__main__":
    main()
