"""End to end `nbx ocr` (CRAFT + the english_g2 CRNN) against torch on the same weights.

    python3 benchmarks/bench_ocr.py [--device cuda|cpu] [--dtype float32|bfloat16|float16]
                                    [--threads N] [--repeats R] [--warmup W]
                                    [--torch-dtypes D,...] [--nbx-tf32] [--size WxH]
                                    [--out DIR]

A 1280x720 image of text lines rendered with Pillow (several fonts and sizes) is read by
nbxtensor's pipeline (models/ocr.py: detector input, CRAFT, boxes, line crops, CRNN, CTC)
and by the same pipeline with both networks run by torch, eager, on the same checkpoints:
EasyOCR's own modules (`easyocr.craft.CRAFT`, `easyocr.model.vgg_model.Model`) when
`import easyocr` works, else a torch re-statement of the published architectures written
here (the output says which). Everything outside the two networks is the same code for
both, so the difference is the networks and their transfers. Reports the detector
(network + boxes), the recogniser (every line) and the total, as the median of R reads
after W warm-up reads (cuda: 5 after 1; cpu: 1 after 0), and both texts. --threads caps
the CPU threads of both (torch's intra-op pool, NumPy's BLAS), for the 2-core comparison.
--torch-dtypes: torch's runs (default: --dtype); cuDNN's algorithm search is off, as
EasyOCR has it. --nbx-tf32: nbx's fp32 products in TF32 (torch's convolutions use TF32 by
default).
--size: another image size (smoke runs). JSON to DIR (default $OUT)/ocr-DEVICE-DTYPE.json.
"""
from __future__ import annotations

import glob
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _opt(name, default):
    for i, a in enumerate(sys.argv):
        if a == f"--{name}" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return default


THREADS = _opt("threads", None)
if THREADS:     # before NumPy loads its BLAS
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[v] = THREADS

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import numpy as np  # noqa: E402

import nbxtensor as nbx  # noqa: E402
from nbxtensor.models import craft as ncraft  # noqa: E402
from nbxtensor.models import crnn as ncrnn  # noqa: E402
from nbxtensor.models import ocr  # noqa: E402
from nbxtensor.models.registry import ocr_weights  # noqa: E402

LINES = [  # (text, font size, font index)
    ("Invoice 2041-B  due 12 March 2026", 40, 0),
    ("The quick brown fox jumps over the lazy dog.", 32, 1),
    ("Total: 1,284.50 EUR (VAT included)", 36, 0),
    ("Contact: support@example.com / +44 20 7946 0958", 28, 2),
    ("Reading order: top to bottom, left to right", 30, 3),
    ("ALPHA 7 BRAVO 12 CHARLIE 99", 44, 3),
    ("small print at the bottom of the page", 22, 1),
]


def _font(size, index):
    from PIL import ImageFont
    found = sorted(glob.glob("/usr/share/fonts/**/DejaVu*.ttf", recursive=True))
    by_name = {os.path.basename(f): f for f in found}
    picks = [by_name[n] for n in ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf",
                                  "DejaVuSans-Bold.ttf") if n in by_name]
    if picks:
        return ImageFont.truetype(picks[index % len(picks)], size), "DejaVu"
    return ImageFont.load_default(size=size), "Pillow default"


def render(width=1280, height=720):
    """Black text lines on white, (height, width, 3) uint8, and the font family used."""
    from PIL import Image, ImageDraw
    im = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(im)
    y, family = 30, ""
    for text, size, idx in LINES:
        f, family = _font(size, idx)
        d.text((40 + (idx * 37) % 120, y), text, fill="black", font=f)
        y += int(size * 2.2)
    return np.asarray(im), family


# ------------------------------------------------------------------ torch networks
def torch_networks(device, dtype):
    """(detector, recogniser, source): EasyOCR's modules, else the re-statement below."""
    import torch
    det_path, rec_path = ocr_weights()
    try:
        from easyocr.craft import CRAFT as ECRAFT
        from easyocr.model.vgg_model import Model as EModel
        det = ECRAFT(pretrained=False, freeze=False)
        rec_model = EModel(input_channel=1, output_channel=256, hidden_size=256,
                           num_class=len(ncrnn.ENGLISH_G2_CHARACTERS) + 1)
        source = "easyocr modules"

        def rec(x):
            return rec_model(x, None)
        rec_net = rec_model
    except Exception as e:  # noqa: BLE001 - easyocr absent or its torchvision import fails
        det, rec_net = _restated_craft(), _restated_crnn()
        rec = rec_net
        source = f"torch re-statement in bench_ocr.py (import easyocr: {type(e).__name__})"
    for net, path in ((det, det_path), (rec_net, rec_path)):
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - an older torch refusing the legacy format so
            sd = torch.load(path, map_location="cpu", weights_only=False)  # (our package's file)
        sd = {k.removeprefix("module."): v for k, v in sd.items()}
        net.load_state_dict(sd)
        net.eval().to(device=device, dtype=dtype)
    return (lambda x: det(x)[0]), rec, source


def _restated_craft():
    """EasyOCR's CRAFT (craft.py, modules.vgg16_bn) in plain torch: torchvision's
    vgg16_bn features by index, in-place ReLUs as there (the skips see them)."""
    import torch
    from torch import nn
    F = nn.functional

    def features():
        layers, c = [], 3
        for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                  512, 512, 512):
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(True)]
                c = v
        return layers

    class VGG(nn.Module):
        def __init__(self):
            super().__init__()
            f = features()
            self.slice1, self.slice2, self.slice3, self.slice4 = (
                nn.Sequential(), nn.Sequential(), nn.Sequential(), nn.Sequential())
            for s, (a, b) in zip((self.slice1, self.slice2, self.slice3, self.slice4),
                                 ((0, 12), (12, 19), (19, 29), (29, 39))):
                for i in range(a, b):
                    s.add_module(str(i), f[i])
            self.slice5 = nn.Sequential(nn.MaxPool2d(3, 1, 1),
                                        nn.Conv2d(512, 1024, 3, padding=6, dilation=6),
                                        nn.Conv2d(1024, 1024, 1))

        def forward(self, x):
            h2 = self.slice1(x)
            h3 = self.slice2(h2)
            h4 = self.slice3(h3)
            h5 = self.slice4(h4)
            return self.slice5(h5), h5, h4, h3, h2

    class DoubleConv(nn.Module):
        def __init__(self, i, m, o):
            super().__init__()
            self.conv = nn.Sequential(nn.Conv2d(i + m, m, 1), nn.BatchNorm2d(m), nn.ReLU(True),
                                      nn.Conv2d(m, o, 3, padding=1), nn.BatchNorm2d(o),
                                      nn.ReLU(True))

        def forward(self, x):
            return self.conv(x)

    class CRAFT(nn.Module):
        def __init__(self):
            super().__init__()
            self.basenet = VGG()
            self.upconv1 = DoubleConv(1024, 512, 256)
            self.upconv2 = DoubleConv(512, 256, 128)
            self.upconv3 = DoubleConv(256, 128, 64)
            self.upconv4 = DoubleConv(128, 64, 32)
            self.conv_cls = nn.Sequential(
                nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(True),
                nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(True),
                nn.Conv2d(32, 16, 3, padding=1), nn.ReLU(True),
                nn.Conv2d(16, 16, 1), nn.ReLU(True), nn.Conv2d(16, 2, 1))

        def forward(self, x):
            s = self.basenet(x)
            y = self.upconv1(torch.cat([s[0], s[1]], 1))
            for up, skip in ((self.upconv2, s[2]), (self.upconv3, s[3]), (self.upconv4, s[4])):
                y = F.interpolate(y, size=skip.shape[2:], mode="bilinear", align_corners=False)
                y = up(torch.cat([y, skip], 1))
            return self.conv_cls(y).permute(0, 2, 3, 1), y

    return CRAFT()


def _restated_crnn():
    """EasyOCR's generation-2 recogniser (model/vgg_model.py) in plain torch."""
    from torch import nn

    class BiLSTM(nn.Module):
        def __init__(self, i, h, o):
            super().__init__()
            self.rnn = nn.LSTM(i, h, bidirectional=True, batch_first=True)
            self.linear = nn.Linear(2 * h, o)

        def forward(self, x):
            return self.linear(self.rnn(x)[0])

    class Extractor(nn.Module):
        def __init__(self, ci, c):
            super().__init__()
            c1, c2, c3 = c // 8, c // 4, c // 2
            self.ConvNet = nn.Sequential(
                nn.Conv2d(ci, c1, 3, 1, 1), nn.ReLU(True), nn.MaxPool2d(2, 2),
                nn.Conv2d(c1, c2, 3, 1, 1), nn.ReLU(True), nn.MaxPool2d(2, 2),
                nn.Conv2d(c2, c3, 3, 1, 1), nn.ReLU(True),
                nn.Conv2d(c3, c3, 3, 1, 1), nn.ReLU(True), nn.MaxPool2d((2, 1), (2, 1)),
                nn.Conv2d(c3, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(True),
                nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(True),
                nn.MaxPool2d((2, 1), (2, 1)), nn.Conv2d(c, c, 2, 1, 0), nn.ReLU(True))

        def forward(self, x):
            return self.ConvNet(x)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.FeatureExtraction = Extractor(1, 256)
            self.AdaptiveAvgPool = nn.AdaptiveAvgPool2d((None, 1))
            self.SequenceModeling = nn.Sequential(BiLSTM(256, 256, 256), BiLSTM(256, 256, 256))
            self.Prediction = nn.Linear(256, len(ncrnn.ENGLISH_G2_CHARACTERS) + 1)

        def forward(self, x):
            f = self.AdaptiveAvgPool(self.FeatureExtraction(x).permute(0, 3, 1, 2)).squeeze(3)
            return self.Prediction(self.SequenceModeling(f).contiguous())

    return Model()


class TorchOCR(ocr.OCR):
    """models/ocr.OCR's pipeline with torch running the two networks."""

    def __init__(self, device, dtype, nets):   # noqa: D107 - no nbx models are loaded
        self.tdevice, self.tdtype = device, dtype
        self.det, self.rec, self.source = nets
        self.charset = ncrnn.ENGLISH_G2_CHARACTERS

    def _run(self, net, x):
        import torch
        with torch.inference_mode():
            return net(torch.from_numpy(x).to(device=self.tdevice, dtype=self.tdtype))[0] \
                .float().cpu().numpy()

    def detect(self, rgb):
        x, ratio = ncraft.detector_input(rgb, ocr.CANVAS_SIZE, ocr.MAG_RATIO)
        maps = self._run(self.det, x)
        region, affinity = maps[..., 0], maps[..., 1]
        boxes = ocr.detection_boxes(region, affinity, ocr.TEXT_THRESHOLD, ocr.LINK_THRESHOLD,
                                    ocr.LOW_TEXT)
        return [(b * (2.0 / ratio)).astype(np.int32) for b in boxes], region, affinity

    def recognise(self, crop, contrast=0.0):
        logits = self._run(self.rec, ocr.line_input(crop, ncrnn.HEIGHT, contrast))
        return ocr.ctc_greedy(ocr.softmax(logits), self.charset)


def timed_reads(reader, rgb, repeats, warmup):
    """(median detect s, median recognise s, median total s, lines) over `repeats` reads
    after `warmup` reads (compiles, caches, cuDNN's algorithm search)."""
    for _ in range(warmup):
        lines = reader.read(rgb)
    det, rec, tot = [], [], []
    for _ in range(repeats):
        t = {}
        t0 = time.perf_counter()
        lines = reader.read(rgb, t)
        tot.append(time.perf_counter() - t0)
        det.append(t["detect"])
        rec.append(t["recognise"])
    return statistics.median(det), statistics.median(rec), statistics.median(tot), lines


def _row(name, det, rec, tot, lines, **extra):
    print(f"{name:16s} detect {det:8.3f} s  recognise {rec:8.3f} s  total {tot:8.3f} s  "
          f"| {' / '.join(t for _, t, _ in lines)}", flush=True)
    return dict(detect_s=det, recognise_s=rec, total_s=tot, text=[t for _, t, _ in lines],
                **extra)


def main():
    """torch first (no compiles), then nbx; each row printed as soon as it is measured."""
    device = _opt("device", "cuda")
    dtype = _opt("dtype", "float32")
    repeats = int(_opt("repeats", "5" if device == "cuda" else "1"))
    warmup = int(_opt("warmup", "1" if device == "cuda" else "0"))
    if "--nbx-tf32" in sys.argv:     # torch's convolutions take TF32 by default (cudnn.allow_tf32)
        nbx.set_float32_matmul_precision("high")
    width, height = (int(v) for v in _opt("size", "1280x720").split("x"))
    rgb, family = render(width, height)
    print(f"bench_ocr: {width}x{height} image, {len(LINES)} lines ({family} fonts); device "
          f"{device}, "
          f"{dtype}, threads {THREADS or 'default'}, median of {repeats} reads after {warmup} "
          f"warm-up read(s)", flush=True)
    rows = {}
    try:
        import torch
    except ImportError:
        torch = None
        print("torch: not importable, no reference run")
    if torch is not None:
        if THREADS:
            torch.set_num_threads(int(THREADS))
        torch.backends.cudnn.benchmark = False      # EasyOCR's default (cudnn_benchmark=False)
        for tname in _opt("torch-dtypes", dtype).split(","):
            tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                   "float16": torch.float16}[tname]
            try:
                treader = TorchOCR(device, tdt, torch_networks(device, tdt))
                print(f"torch {torch.__version__} {tname}: {treader.source}; cudnn.allow_tf32 "
                      f"{torch.backends.cudnn.allow_tf32}", flush=True)
                rows[f"torch {tname}"] = _row(f"torch {tname}",
                                              *timed_reads(treader, rgb, repeats, warmup),
                                              source=treader.source)
            except Exception as e:  # noqa: BLE001 - one failed reference is a line, not the end
                print(f"torch {tname}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    t0 = time.perf_counter()
    reader = ocr.OCR(device, dtype)
    t1 = time.perf_counter()
    reader.read(rgb)
    print(f"nbx {dtype}: models loaded in {t1 - t0:.1f} s, first read (compiles) "
          f"{time.perf_counter() - t1:.1f} s; fp32 precision "
          f"{nbx.get_float32_matmul_precision()}", flush=True)
    n = rows["nbx"] = _row(f"nbx {dtype}", *timed_reads(reader, rgb, repeats, max(warmup - 1, 0)))
    for k, r in rows.items():
        if k.startswith("torch"):
            print(f"{k} time / nbx {dtype} time: detect {r['detect_s'] / n['detect_s']:.2f}, "
                  f"recognise {r['recognise_s'] / n['recognise_s']:.2f}, total "
                  f"{r['total_s'] / n['total_s']:.2f}; texts equal: {r['text'] == n['text']}")
    print("rendered: " + " / ".join(text for text, _, _ in LINES))
    out = _opt("out", os.environ.get("OUT", "."))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"ocr-{device}-{dtype}.json"), "w") as f:
        json.dump({"device": device, "dtype": dtype, "threads": THREADS, "repeats": repeats,
                   "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
