#!/usr/bin/env python3
"""Make spec/fixtures/hf_tokenizer/: small Hugging Face `tokenizer.json` files in the
styles of Llama 3, Qwen 2.5 and GPT-2, and the ids Hugging Face's `tokenizers` gives
for hostile texts, for spec/unit/hf_tokenizer_spec.lua (which needs no Python).

    python3 -m venv .venv-tok && .venv-tok/bin/pip install tokenizers
    .venv-tok/bin/python tools/hf_tokenizer_fixture.py [--out spec/fixtures/hf_tokenizer]

Each tokenizer is trained by BpeTrainer on docs/*.md (sorted; at the commit CORPUS_REV,
so that editing the docs leaves the fixtures alone) to a small vocabulary, with the settings of the model it imitates:
  llama3  Split(Llama 3's regex, isolated) + ByteLevel(no prefix space, no regex),
          BPE with ignore_merges, no normalizer; added tokens after the model's ids
          (<|begin_of_text|>, <|end_of_text|>, <|eot_id|>, ... all special), and a few
          whole words put in the model's vocabulary without merges (as Llama 3's
          vocabulary has tokens no merge makes), so ignore_merges matters;
          merges in the [a, b] array form
  qwen2   Split(Qwen 2.5's regex: single digits) + ByteLevel, NFC normalizer,
          <|endoftext|>, <|im_start|>, <|im_end|> special; <tool_call> added as a
          normal token (normalized false, as Qwen's), and </tool, a prefix of another, "Ångström" and "Cafe\u0301s" (not
          in NFC: matched as normalized) normal normalized ones; merges in the "a b" string form
  smollm  Digits(individual) + ByteLevel(no prefix space, GPT-2's regex), as SmolLM
          (trained without Digits, so that its merges of digits must not apply);
          <|endoftext|>, <|im_start|>, <|im_end|> special
  gpt2    ByteLevel(no prefix space, GPT-2's regex), <|endoftext|> special
  llama2  SentencePiece-style BPE as Llama 2's tokenizer.json: normalizer Prepend("▁") +
          Replace(" ", "▁"), no pre-tokenizer (each text one word), byte_fallback with
          the 256 <0xXX> tokens, unk <unk> fused, <s> </s> special; a small alphabet so
          that rare characters take the byte tokens; decoder Replace, ByteFallback,
          Fuse, Strip(1); trained on words (as SentencePiece: no merge crosses a "▁")
  mistral the same model with Mistral v0.3's Metaspace(prepend_scheme first, no split)
          pre-tokenizer in place of the normalizer, and [INST] [/INST]; trained on
          whole lines, so that merges cross "▁" (each text is one word to the model)
  spm_unk mistral's without byte_fallback: unknown characters are <unk>, runs fused
  flags   gpt2's pipeline with added tokens that have tokenizers' flags: <mask> lstrip
          (RoBERTa's), <|end|> rstrip (Phi-3's), "cat" single_word, "dog" single_word +
          lstrip + rstrip + normalized, <|user|> lstrip + rstrip, "at." (found in what
          a discarded single_word match leaves: not inside it)
Writes <style>/tokenizer.json and expected.json:
  {"tokenizers": version, "styles": {style: {"bos": id the post_processor puts first,
   or null, "cases": [{"name", "text", "ids",
   "decoded", "normalized"}]}}}  -- ids: encode(text, add_special_tokens=False);
   decoded: decode(ids); normalized: the normalizer's text (qwen2 only). decode(ids) is
   the text but for qwen2 (NFC), flags (lstrip / rstrip take the whitespace in), llama2
   mistral and spm_unk (a "▁" put before each piece between added tokens decodes to a
   space; <unk> stands for what it replaced). tokenizers'
   decode puts added tokens through the ByteLevel decoder too, so "Ångström" (whose
   letters Å and ö are byte symbols) decodes to U+FFFD; ztrain decodes it to its text.
"""

import argparse
import glob
import json
import os
import re
import subprocess

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, \
    pre_tokenizers, processors, trainers

# the corpus: docs/*.md at this commit of ztrain (main, when these fixtures were first made)
CORPUS_REV = "b1f7127824aa4b33c065f715f3fbd59f3eb165a1"

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>", "<|reserved_special_token_0|>"]
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# whole words in the Llama-style model vocabulary that no merge makes
EXTRA_WORDS = [" hostile", " tokenizer", " 2024", "supercalifragilistic", "\n\n\n"]

CASES = [
    ("ascii", "Hello, world! The quick brown fox jumps over the lazy dog."),
    ("contractions", "I'm sure it's fine; they're here, we've won, you'll see, he'd go, don't. "
                     "It'S LOUD 'TIS O'CLOCK I'M HE'LL rock'n'roll ''s"),
    ("digits", "In 1984, 3.14159 and 2,718,281 were 42 of 1000000 numbers: 007 x2 4th "
               "١٢٣ ½ Ⅻ 12345678901234567890123 0.000001"),
    ("spaces", "a  b   c    d\te\t\tf \t g\n\nh  \n  i   \r\n j\u00a0k\u3000l \u2028m\u0085n\u200bp"),
    ("separators", "a  \u180ez    \u180e\u180e  b a \u180e\u180eb \u180e \u3000\u3000x\u2028\u2029 \u0085\u00a0y\u180e  z \u200b"),
    ("ends", "   leading and trailing   "),
    ("newlines", "\n\n\nline one\nline two\n\n\n\r\n\r\r\n  \n\t\n x\n"),
    ("accents", "Café, naïve façade, Zürich, Ærøskøbing, São Paulo, Mötley Crüe, Ça va ? ÉCOLE"),
    ("combining", "Cafe\u0301 nai\u0308ve A\u030angstro\u0308m Ångström \u1100\u1161\u11a8 e\u0301\u0301"),
    ("cjk", "日本語のテキスト、中文文本，한국어 텍스트。東京は2024年に"),
    ("emoji", "I ❤️ BPE 😀😃😄 👩‍👩‍👧‍👦 🇫🇷 flags, ✨sparkles✨ and 🤖!"),
    ("scripts", "Ελληνικά Русский текст עברית العربية हिन्दी ไทย"),
    ("symbols", "x += 1; y = f(a, b) -> {c: [d]} // #tag @user $5 ~/path_name \\n %s <|> ===="),
    ("code", "def f(x):\n    return x**2  # square\n\n\tif (a<b) { c->d[0] = '\\0'; }\r\n"),
    ("specials", "<|begin_of_text|>Hi<|eot_id|><|eot_id|> <|end_of_text|>\n<|endoftext|>x"
                 "<|im_start|>user\nhello<|im_end|>\n<tool_call>{}</tool_call></tool </tool_cal"),
    ("special_parts", "<|eot_id <|eot_id|<|eot_id|>| <|im_start <|endoftext| <| |> <|reserved_special_token_0|>>"),
    ("special_spaces", "  <|eot_id|>  <|endoftext|>\n\n<|im_end|>\n"),
    ("added_words", " hostile tokenizer 2024 supercalifragilistic\n\n\nhostile Hostile"),
    ("long_word", "supercalifragilisticexpialidocious" * 4 + " " + "-" * 90 + " " + "ab" * 70),
    ("long_spaces", "x" + " " * 200 + "y" + "\n" * 100 + "z" + "\t" * 50),
    ("long_digits", "9" * 100 + " " + "0123456789" * 7),
    ("flags", "a <mask> b  <mask><|end|>  \n x<|end|>\ny cat concat cats cat, _cat 3cat é cat cat\u0301 "
              "cat\u00a0dog dog  dog\tdogs <|user|> \u3000<|user|>\u3000 <mask>cat<mask>"),
    ("flags_ends", "cat"),
    ("flags_discarded", "xcat. cat. at. cat"),
    ("nfc_added", "Cafés Cafe\u0301s Cafe\u0301 Café"),
    ("flags_spaces", "   <mask>   <|end|>   "),
    ("spm", "<s>Hello</s> <s> [INST] hi [/INST] x<unk>y <0x41> \u2581a\u2581\u2581b  "),
    ("empty", ""),
    ("one_space", " "),
]


def corpus(root, rev):
    """docs/*.md as they are at git revision rev (so that editing the docs does not
    retrain the fixtures), or in the working tree when rev is empty."""
    if not rev:
        parts = []
        for p in sorted(glob.glob(os.path.join(root, "docs", "*.md"))):
            with open(p, encoding="utf-8") as f:
                parts.append(f.read())
        return parts
    names = subprocess.run(["git", "-C", root, "ls-tree", "--name-only", rev, "docs/"], check=True,
                           capture_output=True, text=True).stdout.split()
    return [subprocess.run(["git", "-C", root, "show", f"{rev}:{n}"], check=True, capture_output=True,
                           text=True).stdout for n in sorted(names) if n.endswith(".md")]


def trained(texts, pre, normalizer, ignore_merges, vocab_size):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def byte_level(s):
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = {b: chr(c) for b, c in zip(bs, cs)}
    return "".join(m[b] for b in s.encode("utf-8"))


def sentencepiece(style, texts, vocab_size):
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False, limit_alphabet=150,
                                  special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens)
    lines = [l for t in texts for l in t.split("\n") if l.strip()]
    if style == "llama2":  # trained on words, as SentencePiece: no merge crosses a "▁"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=True)
    tok.train_from_iterator(lines, trainer)
    spec = json.loads(tok.to_str())
    spec["pre_tokenizer"] = None
    # the byte tokens are the model's, not added tokens (as in Llama 2's file)
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in byte_tokens]
    if style == "spm_unk":  # no byte fallback: characters not in the vocabulary are <unk>, fused
        spec["model"]["byte_fallback"] = False
    if style in ("mistral", "spm_unk"):
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    tok = Tokenizer.from_str(json.dumps(spec))
    if style == "mistral":
        tok.add_special_tokens(["[INST]", "[/INST]"])
    tok.post_processor = processors.TemplateProcessing(  # Llama 2's: <s> first
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return json.loads(tok.to_str())


def build(style, texts, vocab_size):
    if style == "llama3":
        pre = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        tok = trained(texts, pre, None, True, vocab_size)
        spec = json.loads(tok.to_str())
        vocab = spec["model"]["vocab"]
        for w in EXTRA_WORDS:
            assert byte_level(w) not in vocab, w
            vocab[byte_level(w)] = len(vocab)
        tok = Tokenizer.from_str(json.dumps(spec))
        tok.add_special_tokens(LLAMA3_SPECIALS)
        bos = tok.token_to_id("<|begin_of_text|>")  # Llama 3's post_processor: <|begin_of_text|> first
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
    elif style == "qwen2":
        pre = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        tok = trained(texts, pre, normalizers.NFC(), False, vocab_size)
        tok.add_special_tokens(QWEN2_SPECIALS)
        tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                        AddedToken("</tool_call>", special=False, normalized=False),
                        AddedToken("</tool", special=False, normalized=False),
                        AddedToken("Ångström", special=False, normalized=True),
                        AddedToken("Cafe\u0301s", special=False, normalized=True)])
    elif style == "smollm":
        # trained without the Digits step, so that the vocabulary has merges of digits
        # that the Digits step must keep apart
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
        tok = trained(texts, pre, None, False, vocab_size)
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
        tok.add_special_tokens(QWEN2_SPECIALS)
    elif style in ("llama2", "mistral", "spm_unk"):
        return sentencepiece(style, texts, vocab_size)
    else:
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
        tok = trained(texts, pre, None, False, vocab_size)
        tok.add_special_tokens(["<|endoftext|>"])
        if style == "flags":
            tok.add_special_tokens([AddedToken("<mask>", lstrip=True), AddedToken("<|end|>", rstrip=True),
                                    AddedToken("<|user|>", lstrip=True, rstrip=True)])
            tok.add_tokens([AddedToken("cat", single_word=True, normalized=False),
                            AddedToken("at.", normalized=False),
                            AddedToken("dog", single_word=True, lstrip=True, rstrip=True, normalized=True)])
    spec = json.loads(tok.to_str())
    if style == "qwen2":  # the older "a b" form of merges (byte-level tokens hold no space)
        spec["model"]["merges"] = [" ".join(m) for m in spec["model"]["merges"]]
    return spec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="spec/fixtures/hf_tokenizer")
    ap.add_argument("--root", default=".", help="the ztrain tree (its docs/*.md are the corpus)")
    ap.add_argument("--vocab-size", type=int, default=1200)
    ap.add_argument("--corpus-rev", default=CORPUS_REV,
                    help="the git revision whose docs/*.md are the corpus ('' for the working tree)")
    a = ap.parse_args()
    texts = corpus(a.root, a.corpus_rev)
    assert texts, "no docs/*.md under " + a.root
    long_text = "\n".join(texts)[:6000]
    out = {"tokenizers": tokenizers.__version__, "vocab_size": a.vocab_size, "styles": {}}
    for style in ("llama3", "qwen2", "smollm", "gpt2", "flags", "llama2", "mistral", "spm_unk"):
        spec = build(style, texts, a.vocab_size)
        text = json.dumps(spec, ensure_ascii=False, indent=1)
        text = re.sub(r"\[\s*(\"(?:[^\"\\]|\\.)*\")\s*,\s*(\"(?:[^\"\\]|\\.)*\")\s*\]", r"[\1, \2]", text)
        os.makedirs(os.path.join(a.out, style), exist_ok=True)
        with open(os.path.join(a.out, style, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
        tok = Tokenizer.from_str(text)
        cases = []
        for name, t in CASES + [("docs", long_text)]:
            ids = tok.encode(t, add_special_tokens=False).ids
            dec = tok.decode(ids, skip_special_tokens=False)
            if style not in ("qwen2", "flags", "llama2", "mistral", "spm_unk"):  # see the docstring
                assert dec == t, (style, name, t, dec)
            case = {"name": name, "text": t, "ids": ids, "decoded": dec}
            if tok.normalizer is not None:
                case["normalized"] = tok.normalizer.normalize_str(t)
            cases.append(case)
        with_specials = tok.encode("x", add_special_tokens=True).ids
        plain = tok.encode("x", add_special_tokens=False).ids
        bos = with_specials[0] if len(with_specials) > len(plain) else None
        out["styles"][style] = {"cases": cases, "bos": bos}
        print(f"{style}: {tok.get_vocab_size()} tokens, {len(cases)} cases")
    text = json.dumps(out, ensure_ascii=False, indent=1)
    text = re.sub(r"\[\s*\d+(?:,\s*\d+)*\s*\]", lambda m: re.sub(r"\s+", "", m.group(0)), text)
    with open(os.path.join(a.out, "expected.json"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(f"wrote {a.out}/{{llama3,qwen2,smollm,gpt2,flags,llama2,mistral,spm_unk}}/tokenizer.json and expected.json "
          f"(tokenizers {tokenizers.__version__})")


if __name__ == "__main__":
    main()
