"""Tokenizers (through the `tokenizers` package) and chat templates (through jinja2).

GGUF files with `tokenizer.ggml.model == "gpt2"` carry a byte-level BPE vocabulary and
merges; we rebuild the tokenizer from them with the pre-tokenizer that
`tokenizer.ggml.pre` names.
"""
from __future__ import annotations

import functools
import json
import os
import re
import threading

import numpy as np

__all__ = ["Tokenizer", "ChatTemplate", "ChatTemplateError"]

# llama.cpp's pre-tokenizer names -> the regex HF uses (None: GPT-2's own regex)
_LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
             r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE = {"gpt2": ("gpt2", False), "default": ("gpt2", False), "smollm": ("gpt2", True),
        "llama-bpe": (_LLAMA3_RE, False), "llama3": (_LLAMA3_RE, False),
        "qwen2": (_QWEN2_RE, False)}


def _gguf_vocab(g):
    """(tokens, merges as pairs, token types as an int array) from GGUF metadata, checked as
    llama.cpp checks them: each token once, valid UTF-8; a merge is two parts split by a
    space; token types and scores, when present, one per token; every special-token id in
    the vocabulary."""
    tokens = g.token_list("tokenizer.ggml.tokens")
    where = f"GGUF {g.path!r}: tokenizer.ggml.tokens"
    if not tokens:
        raise ValueError(f"{where} is empty")
    if len(set(tokens)) != len(tokens):
        seen = {}
        for i, t in enumerate(tokens):
            if t in seen:
                raise ValueError(f"{where} holds {t!r} twice (ids {seen[t]} and {i})")
            seen[t] = i
    try:
        "".join(tokens).encode("utf-8")
    except UnicodeEncodeError:
        bad = next(i for i, t in enumerate(tokens) if not _utf8(t))
        raise ValueError(f"{where}: token {bad} is not valid UTF-8 ({tokens[bad]!r})") from None
    merges = []
    if "tokenizer.ggml.merges" in g:
        for i, m in enumerate(g.token_list("tokenizer.ggml.merges")):
            a, sep, b = m.partition(" ")
            if not (a and sep and b) or not _utf8(m):
                raise ValueError(f"GGUF {g.path!r}: tokenizer.ggml.merges[{i}] is {m!r}, "
                                 f"expected two parts split by a space")
            merges.append((a, b))
    for key, kind in (("tokenizer.ggml.token_type", "int[]"), ("tokenizer.ggml.scores",
                                                                "float[]")):
        n = len(g.typed(key, kind, tokens))
        if n != len(tokens):
            raise ValueError(f"GGUF {g.path!r}: {key} has {n} entries for {len(tokens)} tokens")
    for key in g.keys():
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            g.token_id(key, len(tokens))
    types = np.asarray(g.typed("tokenizer.ggml.token_type", "int[]", [1] * len(tokens)))
    return tokens, merges, types


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


class Tokenizer:
    """encode / decode / special ids over a `tokenizers.Tokenizer`."""

    def __init__(self, tk, bos_id=None, eos_ids=(), add_bos=False, chat_template=None,
                 bos_token=None, eos_token=None):
        self.tk = tk
        self.bos_id = bos_id
        self.eos_ids = [int(i) for i in eos_ids]
        self.add_bos = add_bos
        self.chat_template = ChatTemplate(chat_template, bos_token or "", eos_token or "") \
            if chat_template else None

    @classmethod
    def from_gguf(cls, g) -> "Tokenizer":
        from tokenizers import AddedToken, decoders, models, pre_tokenizers, Regex
        from tokenizers import Tokenizer as HFTok
        kind = g.typed("tokenizer.ggml.model", "str", None)
        if kind != "gpt2":
            raise ValueError(f"GGUF {g.path!r}: tokenizer model {kind!r} is not supported (only "
                             f"byte-level BPE, 'gpt2'); use the HF folder with tokenizer.json")
        pre = g.typed("tokenizer.ggml.pre", "str", "default")
        if pre not in _PRE:
            raise ValueError(f"GGUF {g.path!r}: pre-tokenizer {pre!r} is not supported; "
                             f"supported: {', '.join(_PRE)}")
        tokens, merges, types = _gguf_vocab(g)
        try:
            tk = HFTok(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                  fuse_unk=False))
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
            raise ValueError(f"GGUF {g.path!r}: the vocabulary and merges do not form a BPE "
                             f"tokenizer: {e}") from None
        regex, digits = _PRE[pre]
        steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
        if regex == "gpt2":
            steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
        else:
            steps += [pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        tk.pre_tokenizer = pre_tokenizers.Sequence(steps)
        tk.decoder = decoders.ByteLevel()
        # 3 = control (special), 4 = user-defined: both are matched whole, before BPE
        tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                               for i in np.where(types == 3)[0]])
        user = [AddedToken(tokens[i], normalized=False) for i in np.where(types == 4)[0]]
        if user:
            tk.add_tokens(user)
        bos = g.token_id("tokenizer.ggml.bos_token_id", len(tokens))
        eos = g.token_id("tokenizer.ggml.eos_token_id", len(tokens))
        return cls(tk, bos, g.stop_token_ids(len(tokens)),
                   g.typed("tokenizer.ggml.add_bos_token", "bool", False),
                   g.typed("tokenizer.chat_template", "str", None),
                   tokens[bos] if bos is not None else None,
                   tokens[eos] if eos is not None else None)

    @classmethod
    def from_folder(cls, folder, eos_ids=()) -> "Tokenizer":
        from tokenizers import Tokenizer as HFTok
        from ..files import regular_file
        from .config import read_json
        path = os.path.join(folder, "tokenizer.json")
        regular_file(path, "tokenizer.json")
        tk = HFTok.from_file(path)
        cpath = os.path.join(folder, "tokenizer_config.json")
        cfg = read_json(cpath, "tokenizer_config.json") \
            if regular_file(cpath, "tokenizer_config.json", missing_ok=True) else {}

        def tok_str(v):
            return v.get("content") if isinstance(v, dict) else v
        bos_t, eos_t = tok_str(cfg.get("bos_token")), tok_str(cfg.get("eos_token"))
        bos = tk.token_to_id(bos_t) if bos_t else None
        ids = list(eos_ids)
        if eos_t and tk.token_to_id(eos_t) is not None and tk.token_to_id(eos_t) not in ids:
            ids.append(tk.token_to_id(eos_t))
        tmpl = cfg.get("chat_template")
        if isinstance(tmpl, list):   # named templates: take "default"
            tmpl = next((t["template"] for t in tmpl if t.get("name") == "default"), None)
        return cls(tk, bos, ids, bool(cfg.get("add_bos_token", False)), tmpl, bos_t, eos_t)

    def encode(self, text: str, add_special_tokens: bool = False, allow_special: bool = True,
               max_tokens: int | None = None) -> list[int]:
        """Token ids of `text`. allow_special=False tokenises special-token text (such as
        `<|im_end|>`) as text, not as the control token. max_tokens (a context length)
        refuses a longer text: by its length in characters before tokenising, then by its
        tokens."""
        self._check_chars(text, max_tokens)
        ids = self._encode(text, as_text=not allow_special)
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        self._check_tokens(ids, max_tokens)
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True,
                            allow_special: bool = False, max_tokens: int | None = None
                            ) -> list[int]:
        """Render the chat template and tokenise it. The template's own special tokens are
        control tokens; special-token text inside the messages is tokenised as text unless
        allow_special=True. max_tokens: as in encode."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template; pass raw text (--no-chat)")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if allow_special:
            text = self.chat_template.render(messages, add_generation_prompt)
            # the template writes the BOS itself when the model wants one
            return self.encode(text, max_tokens=max_tokens)
        esc = _Escapes(self._specials)
        text = self.chat_template.render(esc.escape(messages), add_generation_prompt)
        self._check_chars(text, max_tokens)
        # HF's tokenizer splits at special tokens before anything else, so encoding the text
        # between the template's special tokens piece by piece gives the same ids
        ids = []
        for i, piece in enumerate(esc.split(text)):
            if i % 2:
                ids.append(self.tk.token_to_id(piece))
            elif piece:
                ids += self._encode(esc.unescape(piece), as_text=bool(esc.back))
        self._check_tokens(ids, max_tokens)
        return ids

    @functools.cached_property
    def _specials(self) -> list[str]:
        """The special tokens' text, longest first (the order they are matched in)."""
        return sorted({t.content for t in self.tk.get_added_tokens_decoder().values()
                       if t.special and t.content}, key=len, reverse=True)

    @functools.cached_property
    def _lock(self):
        return threading.Lock()

    def _encode(self, text: str, as_text: bool) -> list[int]:
        # as_text: HF's encode_special_tokens, a setting of the tokenizer, held for one call
        with self._lock:
            before = self.tk.encode_special_tokens
            self.tk.encode_special_tokens = as_text
            try:
                return self.tk.encode(text, add_special_tokens=False).ids
            finally:
                self.tk.encode_special_tokens = before

    @functools.cached_property
    def _longest_token(self) -> int:
        # a token covers at most this many characters (byte-level vocabularies spell each
        # byte as one character, so a token's length bounds its characters too)
        return max((len(t) for t in self.tk.get_vocab(with_added_tokens=True)), default=1)

    def _check_chars(self, text, max_tokens) -> None:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        bad = _SURROGATE.search(text)
        if bad:
            raise ValueError(f"the text is not valid Unicode: it holds the lone surrogate "
                             f"U+{ord(bad.group()):04X} at position {bad.start()} (bytes that "
                             f"are not UTF-8?)")
        if max_tokens is not None and len(text) > max_tokens * self._longest_token:
            raise ValueError(f"the prompt is {len(text)} characters, more than the model's "
                             f"context of {max_tokens} tokens can hold (at most "
                             f"{self._longest_token} characters a token); refused before "
                             f"tokenising")

    @staticmethod
    def _check_tokens(ids, max_tokens) -> None:
        if max_tokens is not None and len(ids) > max_tokens:
            raise ValueError(f"the prompt is {len(ids)} tokens, more than the model's context "
                             f"of {max_tokens}")


_SURROGATE = re.compile("[\ud800-\udfff]")
# plane 16 (private use) stands for escaped text while a template renders; message text in
# that plane is escaped as well, so that every such character after rendering is ours
_PLANE16 = "[\U00100000-\U0010fffd]"


class _Escapes:
    """Special-token text inside message strings, replaced by private-use characters while
    the template renders and restored (as text to tokenise) after."""

    def __init__(self, specials):
        alt = "|".join(map(re.escape, specials))
        self.find = re.compile(f"{alt}|{_PLANE16}" if alt else _PLANE16)
        self.split_at = re.compile(f"({alt})") if alt else None
        self.table, self.back = {}, {}

    def _sub(self, m) -> str:
        s = m.group()
        c = self.table.get(s)
        if c is None:
            if len(self.table) >= 0xFFFE:
                raise ValueError("the messages hold more than 65534 distinct special-token "
                                 "texts and private-use characters")
            c = chr(0x100000 + len(self.table))
            self.table[s], self.back[c] = c, s
        return c

    def escape(self, obj):
        if isinstance(obj, str):
            return self.find.sub(self._sub, obj)
        if isinstance(obj, dict):
            return {k: self.escape(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.escape(v) for v in obj)
        return obj

    def split(self, text: str) -> list[str]:
        """text, special, text, special, ..., text (the template's own special tokens)."""
        return self.split_at.split(text) if self.split_at else [text]

    def unescape(self, text: str) -> str:
        if not self.back:
            return text
        return re.sub(_PLANE16, lambda m: self.back.get(m.group(), m.group()), text)


class ChatTemplateError(ValueError):
    """A chat template that does not compile, fails while rendering, or exceeds a limit."""


class ChatTemplate:
    """A HF chat template, rendered with jinja2's sandbox as transformers does, within
    limits (see _template_sandbox): `max_seconds`, `max_chars` of output and of any string
    or list built on the way, and `max_steps` loop iterations and calls."""

    max_seconds = 2.0
    max_chars = 1 << 20
    max_steps = 200_000

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        from . import _template_sandbox as sb
        if not isinstance(source, str):
            raise TypeError(f"chat template must be a str, got {type(source).__name__}")

        def raise_exception(msg):
            raise ChatTemplateError(f"the chat template refuses the messages: {msg}")

        def strftime_now(fmt):
            import datetime
            return datetime.datetime.now().strftime(fmt)

        def tojson(x, indent=None, **kw):
            if indent is not None and (not isinstance(indent, (int, str)) or
                                       len(str(indent)) > sb.MAX_TOJSON_INDENT or
                                       isinstance(indent, int) and indent > sb.MAX_TOJSON_INDENT):
                raise ChatTemplateError(f"chat template: tojson indent {indent!r} is not an int "
                                        f"or str of at most {sb.MAX_TOJSON_INDENT}")
            return json.dumps(x, indent=indent, ensure_ascii=False)
        env = sb.BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        self.source = source
        self.template = sb.compile_template(env, source)
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages, add_generation_prompt: bool = True) -> str:
        from . import _template_sandbox as sb
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return sb.render(self.template, dict(messages=messages,
                                             add_generation_prompt=add_generation_prompt,
                                             bos_token=self.bos_token, eos_token=self.eos_token),
                         self.max_chars, self.max_seconds, self.max_steps)
