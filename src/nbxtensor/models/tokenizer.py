"""Tokenizers (through the `tokenizers` package) and chat templates (through jinja2).

GGUF files with `tokenizer.ggml.model == "gpt2"` carry a byte-level BPE vocabulary and
merges; we rebuild the tokenizer from them with the pre-tokenizer that
`tokenizer.ggml.pre` names.
"""
from __future__ import annotations

import json
import os

import numpy as np

__all__ = ["Tokenizer", "ChatTemplate"]

# llama.cpp's pre-tokenizer names -> the regex HF uses (None: GPT-2's own regex)
_LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
             r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE = {"gpt2": ("gpt2", False), "default": ("gpt2", False), "smollm": ("gpt2", True),
        "llama-bpe": (_LLAMA3_RE, False), "llama3": (_LLAMA3_RE, False),
        "qwen2": (_QWEN2_RE, False)}


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
        kind = g.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"GGUF {g.path!r}: tokenizer model {kind!r} is not supported (only "
                             f"byte-level BPE, 'gpt2'); use the HF folder with tokenizer.json")
        pre = g.get("tokenizer.ggml.pre", "default")
        if pre not in _PRE:
            raise ValueError(f"GGUF {g.path!r}: pre-tokenizer {pre!r} is not supported; "
                             f"supported: {', '.join(_PRE)}")
        tokens = g.token_list("tokenizer.ggml.tokens")
        merges = [tuple(m.split(" ", 1)) for m in g.token_list("tokenizer.ggml.merges")] \
            if "tokenizer.ggml.merges" in g else []
        tk = HFTok(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                              fuse_unk=False))
        regex, digits = _PRE[pre]
        steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
        if regex == "gpt2":
            steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
        else:
            steps += [pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        tk.pre_tokenizer = pre_tokenizers.Sequence(steps)
        tk.decoder = decoders.ByteLevel()
        types = np.asarray(g.array("tokenizer.ggml.token_type")) \
            if "tokenizer.ggml.token_type" in g else np.ones(len(tokens), int)
        # 3 = control (special), 4 = user-defined: both are matched whole, before BPE
        tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                               for i in np.where(types == 3)[0]])
        user = [AddedToken(tokens[i], normalized=False) for i in np.where(types == 4)[0]]
        if user:
            tk.add_tokens(user)
        bos = g.get("tokenizer.ggml.bos_token_id")
        eos = g.get("tokenizer.ggml.eos_token_id")
        return cls(tk, bos, g.stop_token_ids(), bool(g.get("tokenizer.ggml.add_bos_token", False)),
                   g.get("tokenizer.chat_template"),
                   tokens[bos] if bos is not None else None,
                   tokens[eos] if eos is not None else None)

    @classmethod
    def from_folder(cls, folder, eos_ids=()) -> "Tokenizer":
        from tokenizers import Tokenizer as HFTok
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{folder}: no tokenizer.json")
        tk = HFTok.from_file(path)
        cfg = {}
        cpath = os.path.join(folder, "tokenizer_config.json")
        if os.path.isfile(cpath):
            with open(cpath) as f:
                cfg = json.load(f)

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

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self.tk.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        if self.chat_template is None:
            raise ValueError("this model has no chat template; pass raw text (--no-chat)")
        text = self.chat_template.render(messages, add_generation_prompt)
        # the template writes the BOS itself when the model wants one
        return self.encode(text, add_special_tokens=False)


class ChatTemplate:
    """A HF chat template, rendered with jinja2's sandbox as transformers does."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(msg):
            raise jinja2.exceptions.TemplateError(msg)

        def strftime_now(fmt):
            import datetime
            return datetime.datetime.now().strftime(fmt)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, indent=indent,
                                                                       ensure_ascii=False)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        self.source = source
        self.template = env.from_string(source)
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages, add_generation_prompt: bool = True) -> str:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                    bos_token=self.bos_token, eos_token=self.eos_token)
