#!/usr/bin/env python3
"""Make spec/fixtures/bpe/: what Hugging Face's `tokenizers` (the reference byte-level
BPE) gives, for spec/unit/bpe_spec.lua to compare ztrain.model.data.bpe and bpe_train against.

    pip install tokenizers            # PyPI; not a Debian package
    python3 tools/make_bpe_fixture.py [--out spec/fixtures/bpe] [--vocab data/bpe/fortunes]
                                      [--corpus /usr/share/games/fortunes]

Writes:
  expected.json    {
    "tokenizers": version,
    "cases": [{"name", "text", "ids", "pre"}]  -- the shipped vocabulary (--vocab) loaded as a
                                         -- ByteLevel BPE (GPT-2's pre-tokenizer, no
                                         -- prefix space) + "<|endoftext|>" as a special
                                         -- token: encode(text) for texts with non-ASCII,
                                         -- digits, contractions, runs of spaces, tabs...;
                                         -- "pre": the ByteLevel pre-tokenizer's pieces
    "tiny": {"cases": [...]}             -- the same with tiny/ (a hand-made vocabulary
                                         -- whose merge ranks make the merge order matter)
    "train": {"text", "vocab_size", "min_frequency", "merges"}
                                         -- BpeTrainer's merges on a small text
    "corpus": {"files": [{"name", "bytes", "bytes_hash", "tokens", "ids_hash"}],
               "train_merges": n, "train_merges_hash": h, "shipped_equal": bool}
                                         -- each corpus file encoded whole; and
                                         -- BpeTrainer on the corpus's training parts
                                         -- (data.text's split) with the shipped settings
  }
  tiny/vocab.json, tiny/merges.txt

Hashes are 32-bit FNV-1a over a sequence of integers (bytes, or token ids):
h = 2166136261; for x: h = ((h ^ x) * 16777619) mod 2^32.
"""

import argparse
import glob
import json
import os
import re
import sys

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"


def fnv(xs):
    h = 2166136261
    for x in xs:
        h = ((h ^ x) * 16777619) & 0xFFFFFFFF
    return h


def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()


def load(vocab_dir):
    tok = Tokenizer(models.BPE.from_file(os.path.join(vocab_dir, "vocab.json"),
                                         os.path.join(vocab_dir, "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if EOT in tok.get_vocab():
        tok.add_special_tokens([EOT])
    return tok


def encode(tok, text):
    ids = tok.encode(text).ids
    back = tok.decode(ids, skip_special_tokens=False)
    assert back == text, (text, back)
    return ids


CASES = [
    ("ascii", "Hello, world! The quick brown fox jumps over the lazy dog."),
    ("contractions", "I'm sure it's fine; they're here, we've won, you'll see, he'd go, don't. "
                     "It'S LOUD 'tis o'clock rock'n'roll ''s"),
    ("digits", "In 1984, 3.14159 and 2,718,281 were 42 of 1000000 numbers: 007 x2 4th ١٢٣ ½ Ⅻ"),
    ("spaces", "a  b   c    d\te\t\tf \t g\n\nh  \n  i   \r\n j\u00a0k\u3000l \u2028m\u0085n\u180eo\u200bp"),
    ("separators", "a \u180e\u180eb \u180e \u3000\u3000x\u2028\u2029 \u0085\u00a0y\u180e  z \u200b"),
    ("ends", "   leading and trailing   "),
    ("newlines", "\n\n\nline one\nline two\n\n\n"),
    ("accents", "Café, naïve façade, Zürich, Ærøskøbing, São Paulo, Mötley Crüe, Ça va ? ÉCOLE"),
    ("cjk", "日本語のテキスト、中文文本，한국어 텍스트。東京は2024年に"),
    ("emoji", "I ❤️ BPE 😀😃😄 👩‍👩‍👧‍👦 🇫🇷 flags, ✨sparkles✨ and 🤖!"),
    ("scripts", "Ελληνικά Русский текст עברית العربية हिन्दी ไทย"),
    ("symbols", "x += 1; y = f(a, b) -> {c: [d]} // #tag @user $5 ~/path_name \\n %s <|> ===="),
    ("eot", "first document.<|endoftext|>Second document<|endoftext|><|endoftext|> third"),
    ("fortune", "A day without sunshine is like, you know, night.\n\t\t-- Steve Martin\n%\n"),
    ("long_word", "supercalifragilisticexpialidocious" * 4 + " " + "-" * 90 + " " + "ab" * 70),
    ("long_spaces", "x" + " " * 200 + "y" + "\n" * 100 + "z"),
]

# A hand-made vocabulary over the 256 byte symbols whose ranks make the merge order
# matter: "aa a" outranks "a a", so "aaaa" -> "aaa" "a" (leftmost lowest rank, merged
# one at a time), not "aa" "aa" (every "a a" at once).
TINY_MERGES = [("aa", "a"), ("b", "c"), ("a", "a"), ("a", "bc"), ("a", "b"), ("ab", "c"),
               ("Ġ", "a"), ("Ġa", "aa"), ("c", "c"), ("cc", "cc"), ("x", "y"), ("xy", "xy"),
               ("xyxy", "xyxy"), ("y", "x")]
TINY_CASES = [
    ("overlap", "aaaa aaaaa aaaaaaa a aa aaa"),
    ("chain", "abc abcbc bcabc aabc xyxyxyxyxy yxyx"),
    ("long", "a" * 131 + " " + "abc" * 40 + " " + "xy" * 77 + "c" * 65),
    ("other", "hello, wörld"),
]


def tiny_vocab():
    vocab = {}
    for b in range(256):
        vocab[B2U[b]] = len(vocab)  # any order; only the strings matter to tokenizers
    for a, b in TINY_MERGES:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    for t in ("aa", "xy"):
        assert t in vocab
    vocab[EOT] = len(vocab)
    return vocab


TRAIN_TEXT = (
    "the cat sat on the mat. the cat ate the rat; the rat sat on the cat's hat!\n"
    "that hat? it's the cat's hat, that's that. 1234 1234 12 34 aaaa aaa aa a\n"
    "Über café café CAFÉ 😀😀 😀 日本 日本語\n\n\t\tthe end   the end\n"
) * 3 + "odd one out: zebra quartz"


def split_index(s, f):
    """data.text's split point (1-based index of the first validation byte)."""
    n = len(s)
    if f <= 0 or n == 0:
        return n + 1
    v = int(n * (1 - f)) + 1
    if v <= 1:
        return 1
    a = s.find(b"\n%\n", max(1, v - 3) - 1)
    if a >= 0 and a + 1 + 3 <= n:
        return a + 1 + 3
    a = s.find(b"\n", v - 2)
    if a >= 0:
        return a + 2
    while v <= n:
        b = s[v - 1]
        if b < 0x80 or b >= 0xC0:
            return v
        v += 1
    return n + 1


def corpus_files(corpus):
    """data.text's selection: sorted names, *.dat excluded, a file reached under several
    names read once under the first."""
    seen, out = set(), []
    for p in sorted(glob.glob(os.path.join(corpus, "*"))):
        if os.path.isdir(p) or p.endswith(".dat"):
            continue
        real = os.path.realpath(p)
        if real in seen:
            continue
        seen.add(real)
        out.append(p)
    return out


def train_hf(texts, vocab_size, min_frequency):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="spec/fixtures/bpe")
    ap.add_argument("--vocab", default="data/bpe/fortunes")
    ap.add_argument("--corpus", default="/usr/share/games/fortunes")
    ap.add_argument("--vocab-size", type=int, default=8192, help="as the shipped vocabulary")
    ap.add_argument("--min-frequency", type=int, default=2)
    ap.add_argument("--valid-fraction", type=float, default=0.05)
    a = ap.parse_args()
    os.makedirs(os.path.join(a.out, "tiny"), exist_ok=True)
    out = {"tokenizers": tokenizers.__version__, "vocab": a.vocab}

    tok = load(a.vocab)
    out["cases"] = [{"name": n, "text": t, "ids": encode(tok, t)} for n, t in CASES]
    # the pre-tokenizer alone (its pieces in byte-level form), where no special token
    # cuts the text first
    pt = pre_tokenizers.ByteLevel(add_prefix_space=False)
    for c in out["cases"]:
        if EOT not in c["text"]:
            c["pre"] = [p for p, _ in pt.pre_tokenize_str(c["text"])]

    tdir = os.path.join(a.out, "tiny")
    vocab = tiny_vocab()
    with open(os.path.join(tdir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, indent=0)
        f.write("\n")
    with open(os.path.join(tdir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for x, y in TINY_MERGES:
            f.write(f"{x} {y}\n")
    tiny = load(tdir)
    out["tiny"] = {"cases": [{"name": n, "text": t, "ids": encode(tiny, t)} for n, t in TINY_CASES]}

    tv, tm = 300, 2
    out["train"] = {"text": TRAIN_TEXT, "vocab_size": tv, "min_frequency": tm,
                    "merges": train_hf([TRAIN_TEXT], tv, tm)}

    if os.path.isdir(a.corpus):
        files, train_texts = [], []
        for p in corpus_files(a.corpus):
            with open(p, "rb") as f:
                raw = f.read()
            text = raw.decode("utf-8")
            ids = tok.encode(text).ids
            files.append({"name": os.path.basename(p), "bytes": len(raw), "bytes_hash": fnv(raw),
                          "tokens": len(ids), "ids_hash": fnv(ids)})
            train_texts.append(raw[:split_index(raw, a.valid_fraction) - 1].decode("utf-8"))
        merges = train_hf(train_texts, a.vocab_size, a.min_frequency)
        with open(os.path.join(a.vocab, "merges.txt"), encoding="utf-8") as f:
            shipped = [l.rstrip("\n") for l in f if not l.startswith("#version")]
        joined = "\n".join(merges).encode("utf-8")
        out["corpus"] = {"dir": a.corpus, "files": files, "vocab_size": a.vocab_size,
                         "min_frequency": a.min_frequency, "valid_fraction": a.valid_fraction,
                         "train_merges": len(merges), "train_merges_hash": fnv(joined),
                         "shipped_equal": shipped == merges}
        print(f"corpus: {len(files)} files, {sum(x['tokens'] for x in files)} tokens; "
              f"BpeTrainer {len(merges)} merges, equal to {a.vocab}/merges.txt: {shipped == merges}")
        if shipped != merges:
            for i, (x, y) in enumerate(zip(shipped, merges)):
                if x != y:
                    print(f"  first difference at merge {i + 1}: shipped {x!r}, BpeTrainer {y!r}")
                    break
    else:
        print(f"no corpus at {a.corpus}: the corpus checks are left out", file=sys.stderr)

    text = json.dumps(out, ensure_ascii=False, indent=1)
    # lists of numbers on one line each
    text = re.sub(r"\[\s*\d+(?:,\s*\d+)*\s*\]", lambda m: re.sub(r"\s+", "", m.group(0)), text)
    with open(os.path.join(a.out, "expected.json"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(f"wrote {a.out}/expected.json, {tdir}/vocab.json, {tdir}/merges.txt "
          f"(tokenizers {tokenizers.__version__})")


if __name__ == "__main__":
    main()
