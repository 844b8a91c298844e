"""`nbx` at bad input: one line `nbx: error: ...` on stderr and exit status 2, never a
traceback (only with --debug); a bug says `nbx: internal error: ...` and exits 70. Each
invocation runs in a subprocess under a timeout, on small GGUF files built here."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import rng

SPECIALS = ["<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
          "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")


def _byte_chars():
    # GPT-2's byte -> character table: a byte-level BPE vocabulary holds these 256
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_gguf(path, template=CHATML, head_count=2, bos=None, context=64):
    """A one-layer F32 Llama with a byte-level vocabulary (256 bytes + 2 control tokens)."""
    gguf = pytest.importorskip("gguf")
    g = rng()
    tokens = _byte_chars() + SPECIALS
    V, D, F, H, Hkv = len(tokens), 16, 32, 2, 1
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(context)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(head_count)
    w.add_head_count_kv(Hkv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3, 3])
    w.add_token_merges([])
    w.add_eos_token_id(V - 1)
    if bos is not None:
        w.add_bos_token_id(bos)
    if template is not None:
        w.add_chat_template(template)
    hd = D // H
    t = {"token_embd.weight": (V, D), "output_norm.weight": (D,), "output.weight": (V, D),
         "blk.0.attn_norm.weight": (D,), "blk.0.ffn_norm.weight": (D,),
         "blk.0.attn_q.weight": (H * hd, D), "blk.0.attn_k.weight": (Hkv * hd, D),
         "blk.0.attn_v.weight": (Hkv * hd, D), "blk.0.attn_output.weight": (D, H * hd),
         "blk.0.ffn_gate.weight": (F, D), "blk.0.ffn_up.weight": (F, D),
         "blk.0.ffn_down.weight": (D, F)}
    for name, shape in t.items():
        a = 1 + 0.1 * g.standard_normal(shape) if len(shape) == 1 else \
            g.standard_normal(shape) / np.sqrt(shape[-1])
        w.add_tensor(name, a.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def nbx(*args, timeout=120):
    r = subprocess.run([sys.executable, "-m", "nbxtensor.cli", *args], capture_output=True,
                       timeout=timeout)
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")


def assert_one_line_error(rc, err, *fragments):
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("nbx: error: "), (rc, err[-3000:])
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzzcli")
    write_gguf(d / "ok.gguf")
    return d


ARG_CASES = {
    "batch_size_0": (["embed", "minilm", "x", "--batch-size", "0"], "--batch-size: must be >= 1"),
    "batch_size_neg": (["embed", "minilm", "x", "--batch-size", "-1"], "--batch-size"),
    "batch_size_text": (["embed", "minilm", "x", "--batch-size", "many"], "expected an integer"),
    "max_new_neg": (["generate", "M", "--prompt", "x", "--max-new-tokens", "-1"],
                    "--max-new-tokens: must be >= 1"),
    "temperature_neg": (["generate", "M", "--prompt", "x", "--temperature", "-0.5"],
                        "--temperature: must be >= 0"),
    "temperature_nan": (["generate", "M", "--prompt", "x", "--temperature", "nan"],
                        "--temperature"),
    "top_p_0": (["generate", "M", "--prompt", "x", "--top-p", "0"], "--top-p: must be in (0, 1]"),
    "top_p_big": (["generate", "M", "--prompt", "x", "--top-p", "1.5"], "--top-p"),
    "top_k_neg": (["generate", "M", "--prompt", "x", "--top-k", "-1"], "--top-k: must be >= 0"),
    "rep_penalty_0": (["generate", "M", "--prompt", "x", "--repetition-penalty", "0"],
                      "--repetition-penalty"),
    "seed_neg": (["generate", "M", "--prompt", "x", "--seed", "-1"], "--seed"),
    "tune_budget": (["tune", "--shapes", "1x4x4", "--budget", "-1"], "--budget"),
    "tune_huge_shape": (["tune", "--shapes", "99999999999x99999999x9999999", "--device",
                         "interp"], "has an operand of"),
    "tune_clear_with_list": (["tune", "--list", "--json", "--clear"], "--clear goes alone"),
    "tune_contexts_neg": (["tune", "M", "--device", "interp", "--contexts=-5"],
                          "--contexts must be comma-separated positive ints"),
    "no_command": ([], "required: command"),
    "unknown_flag": (["generate", "M", "--prompt", "x", "--nope"], "unrecognized arguments"),
    "missing_path": (["generate", "./no/such/model.gguf", "--prompt", "x"], "does not exist"),
    "missing_embed_path": (["embed", "/no/such/folder/", "x"], "does not exist"),
    "bad_device": (["generate", "M", "--prompt", "x", "--device", "tpu"], "--device"),
    "cuda_99": (["generate", "M", "--prompt", "x", "--device", "cuda:99"], "--device cuda:99"),
}


@pytest.mark.parametrize("name", sorted(ARG_CASES))
def test_bad_arguments_are_one_line(name, gguf_dir):
    args, fragment = ARG_CASES[name]
    args = [str(gguf_dir / "ok.gguf") if a == "M" else a for a in args]
    assert_one_line_error(*nbx(*args)[::2], fragment)


def test_prompt_bytes_that_are_not_utf8(gguf_dir):
    rc, _, err = nbx("generate", str(gguf_dir / "ok.gguf"), "--prompt".encode(), b"ab\xff\xfe")
    assert_one_line_error(rc, err, "--prompt: is not valid UTF-8: byte(s) ff fe at character 2")
    rc, _, err = nbx("embed", "minilm", b"\xc3")
    assert_one_line_error(rc, err, "not valid UTF-8")


def test_cuda_without_a_gpu_is_one_line(gguf_dir):
    from nbxtensor.backends.cuda import driver
    if driver.availability()[0]:
        pytest.skip("this machine has a GPU (cuda:99 above covers the refusal)")
    rc, _, err = nbx("generate", str(gguf_dir / "ok.gguf"), "--prompt", "x", "--device", "cuda")
    assert_one_line_error(rc, err, "--device cuda: no usable GPU")


TEMPLATE_CASES = {
    "nested_loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                     "{% endfor %}", "chat template: "),
    "huge_pow": ("{{ 10 ** (10 ** 8) }}", "bits"),
    "huge_output": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
                    "the rendered prompt"),
    "dunder": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
    "syntax": ("{% if %}", "syntax error on line 1"),
    "undefined": ("{{ nope.x }}", "UndefinedError"),
    "raise": ("{{ raise_exception('only user and assistant roles') }}", "only user and assistant"),
    "macro_recursion": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
}


@pytest.mark.parametrize("name", sorted(TEMPLATE_CASES))
def test_hostile_template_in_the_model_is_one_line(name, tmp_path):
    source, fragment = TEMPLATE_CASES[name]
    path = write_gguf(tmp_path / "t.gguf", template=source)
    assert_one_line_error(*nbx("generate", path, "--prompt", "hi", "--device", "cpu")[::2],
                          fragment)


def test_bad_token_ids_and_head_count_are_one_line(tmp_path):
    rc, _, err = nbx("generate", write_gguf(tmp_path / "bos.gguf", bos=10 ** 6), "--prompt", "x",
                     "--device", "cpu")
    assert_one_line_error(rc, err)
    rc, _, err = nbx("generate", write_gguf(tmp_path / "h0.gguf", head_count=0), "--prompt", "x",
                     "--device", "cpu")
    assert_one_line_error(rc, err)


def test_context_limits_are_one_line(gguf_dir):
    m = str(gguf_dir / "ok.gguf")      # context 64
    rc, _, err = nbx("generate", m, "--prompt", "x" * 5000, "--device", "cpu")
    assert_one_line_error(rc, err, "refused before tokenising")
    rc, _, err = nbx("generate", m, "--prompt", "hi", "--device", "cpu", "--max-new-tokens", "60")
    assert_one_line_error(rc, err, "exceed the model's context of 64 tokens")


def test_generate_runs_and_special_text_is_escaped(gguf_dir):
    m = str(gguf_dir / "ok.gguf")
    rc, out, err = nbx("generate", m, "--prompt", "hi<|im_end|>", "--device", "cpu",
                       "--max-new-tokens", "2")
    assert rc == 0 and "Traceback" not in err, err
    # 'hi<|im_end|>' as text: 12 byte tokens; with --allow-special 3 (h, i, the control token)
    n_text = int(err.split("prompt ")[1].split(" tokens")[0])
    rc, _, err = nbx("generate", m, "--prompt", "hi<|im_end|>", "--device", "cpu",
                     "--max-new-tokens", "2", "--allow-special")
    assert rc == 0, err
    assert n_text - int(err.split("prompt ")[1].split(" tokens")[0]) == 12 - 3


def test_interp_warns_and_shows_prefill(gguf_dir):
    pytest.importorskip("triton")
    rc, _, err = nbx("generate", str(gguf_dir / "ok.gguf"), "--prompt", "hi", "--device",
                     "interp", "--max-new-tokens", "1", "--no-chat", timeout=600)
    assert rc == 0, err[-3000:]
    assert "nbx: warning: device 'interp'" in err and "test device" in err
    assert "nbx: progress: prefill of 2 tokens done in" in err


def test_internal_error_is_one_line_with_exit_70(capsys, monkeypatch):
    from nbxtensor import cli, cli_commands

    def broken(args):
        raise AssertionError("an invariant of ours")
    monkeypatch.setattr(cli_commands, "cmd_embed", broken)
    assert cli.main(["embed", "minilm", "x"]) == 70
    err = capsys.readouterr().err
    assert err.splitlines() == ["nbx: internal error: AssertionError: an invariant of ours "
                                "(run with --debug for the traceback)"]
    assert cli.main(["embed", "minilm", "x", "--debug"]) == 70
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.splitlines()[-1].startswith("nbx: internal error")


def test_debug_shows_the_traceback_of_a_user_error():
    rc, _, err = nbx("--debug", "generate", "./no/such.gguf", "--prompt", "x")
    assert rc == 2 and "Traceback (most recent call last)" in err
    assert err.splitlines()[-1].startswith("nbx: error: MODEL './no/such.gguf' does not exist")


def test_missing_config_key_names_the_key(tmp_path):
    import json
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    rc, _, err = nbx("generate", str(tmp_path), "--prompt", "x", "--device", "cpu")
    assert_one_line_error(rc, err)
    assert err.strip() != "nbx: error: 'num_attention_heads'"


@pytest.mark.parametrize("case", ["census_fifo", "census_dir", "out_missing_parent",
                                  "out_is_a_file"])
def test_build_kernels_refuses_bad_paths_before_compiling(tmp_path, case):
    """A FIFO as --census blocked the read forever; an --out that cannot be created failed
    only after minutes of compiling (each case here must answer in seconds, not build)."""
    import os
    fifo, blocker = tmp_path / "census.fifo", tmp_path / "a_file"
    os.mkfifo(fifo)
    blocker.write_text("x")
    args = {"census_fifo": ["--census", str(fifo)], "census_dir": ["--census", str(tmp_path)],
            "out_missing_parent": ["--out", str(blocker / "sub")],
            "out_is_a_file": ["--out", str(blocker)]}[case]
    rc, _, err = nbx("build-kernels", "--arch", "sm_90", *args, timeout=60)
    assert_one_line_error(rc, err, "--census" if case.startswith("census") else "--out")
