"""CRAFT, the character-region text detector (Baek et al., 2019), as EasyOCR ships it.

A VGG16-BN backbone cut into five slices, a U-Net decoder of four `double_conv` blocks
(1x1 then 3x3 convolution, each with batch norm and ReLU) over bilinear upsampling, and a
head that gives two score maps at half the input resolution: the region score (how
likely a pixel is the centre of a character) and the affinity score (how likely it lies
between two characters of one word). Parameter names are those of EasyOCR's CRAFT, so
`craft_mlt_25k.pth` loads with its DataParallel `module.` prefix stripped.

A detail the weights depend on: torchvision's VGG applies ReLU in place, so the skip
connections taken at the ends of slices 1-3 are seen by the decoder after the ReLU that
opens the next slice, while the one at the end of slice 4 (followed by a max pool) and
fc7 are not.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .. import nn
from .. import ops as _ops
from ..nn import functional as F
from ..ops.conv import conv2d_activation

__all__ = ["CRAFT", "Layers", "MEAN", "STD", "cat_channels", "detector_input",
           "fold_batch_norm", "from_checkpoint", "load_state"]

MEAN = (0.485, 0.456, 0.406)        # ImageNet statistics, applied to RGB in [0, 255]
STD = (0.229, 0.224, 0.225)


def from_checkpoint(cls):
    """`cls` without its random initialisation: the layers of these models take every
    weight from a checkpoint (a strict load_state_dict refuses one that lacks any), and
    drawing ~20M numbers from torch's generator first costs seconds."""
    return type(cls.__name__, (cls,), {"reset_parameters": lambda self: None,
                                       "__module__": cls.__module__})


Conv2d = from_checkpoint(nn.Conv2d)


class Layers(nn.Module):
    """A torch `nn.Sequential` as saved: the layers with weights keep their index (from
    `start`, for a slice of a longer list) as their name, so checkpoint keys match; the
    ones without (ReLU, pooling) are plain functions kept in order with them."""

    def __init__(self, layers, start=0):
        super().__init__()
        self._plan = []
        for i, layer in enumerate(layers, start):
            if isinstance(layer, nn.Module):
                self.add_module(str(i), layer)
                self._plan.append(str(i))
            else:
                self._plan.append(layer)

    def forward(self, x):
        for step in self._plan:
            if isinstance(step, str):
                x = getattr(self, step)(x)
            elif isinstance(step, tuple):         # (conv name, activation): a fused step
                m = getattr(self, step[0])
                x = conv2d_activation(x, m.weight, m.bias, m.stride, m.padding, m.dilation,
                                      m.groups, padding_mode=m.padding_mode,
                                      activation=step[1])
            else:
                x = step(x)
        return x

    def fuse(self):
        """For inference (weights loaded, eval mode): each batch norm that follows a
        convolution is folded into it and removed, and each ReLU that follows one is
        applied in its pass (ops/conv.conv2d_activation). The model then computes the
        same function in fewer passes over the activations; its state dict holds the
        folded weights (a checkpoint loads into an unfused model)."""
        plan, fused, i = self._plan, [], 0
        while i < len(plan):
            step = plan[i]
            i += 1
            if not (isinstance(step, str) and isinstance(getattr(self, step), nn.Conv2d)):
                fused.append(step)
                continue
            if i < len(plan) and isinstance(plan[i], str) and \
                    isinstance(getattr(self, plan[i]), nn.BatchNorm2d):
                fold_batch_norm(getattr(self, step), getattr(self, plan[i]))
                delattr(self, plan[i])
                i += 1
            act = None
            if i < len(plan) and plan[i] is relu:
                act, i = "relu", i + 1
            fused.append((step, act))
        self._plan = fused
        return self


def _taps_major(conv):
    """conv's weight (C_out, C_in, KH, KW) stored as (KH, KW, C_in, C_out) memory (a view of
    the same shape): the layout the GPU kernels read B in, so no call copies the weight into
    it (kernels/conv.py; 1x1 and depthwise convs read any layout). Values unchanged."""
    w = conv.weight        # the copy on the host: a strided copy on interp takes minutes
    taps = w.cpu().permute(2, 3, 1, 0).contiguous().to(w.device)
    conv.weight = nn.Parameter(taps.permute(3, 2, 0, 1))


def fold_batch_norm(conv, bn):
    """conv's weight and bias with the eval-mode batch norm after it folded in:
    w * g / sqrt(var + eps) per output channel, (b - mean) * g / sqrt(var + eps) + beta,
    computed in float64 on the host and rounded once to the weight's dtype."""
    from ..creation import from_numpy
    w = conv.weight.double().cpu().numpy()
    n = w.shape[0]

    def vec(t, fill):
        return np.full(n, fill) if t is None else t.double().cpu().numpy()
    scale = vec(bn.weight, 1.0) / np.sqrt(vec(bn.running_var, 1.0) + bn.eps)
    shift = vec(bn.bias, 0.0) - vec(bn.running_mean, 0.0) * scale
    b = vec(conv.bias, 0.0) * scale + shift
    dev, dt = conv.weight.device, conv.weight.dtype
    conv.weight = nn.Parameter(from_numpy(w * scale.reshape((n,) + (1,) * (w.ndim - 1)))
                               .to(dt).to(dev))
    conv.bias = nn.Parameter(from_numpy(b).to(dt).to(dev))


def relu(x):
    return F.relu(x)


def max_pool(kernel, stride, padding=0):
    return functools.partial(F.max_pool2d, kernel_size=kernel, stride=stride, padding=padding)


def _vgg16_bn_features(cfg):
    """torchvision's vgg16_bn `features` as a list: conv, bn, relu per number, 'M' a pool."""
    layers, c = [], 3
    for v in cfg:
        if v == "M":
            layers.append(max_pool(2, 2))
        else:
            layers += [Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), relu]
            c = v
    return layers


_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512)


class VGG16BN(nn.Module):
    """The backbone: slices end at conv2_2, conv3_3, conv4_3, conv5_3 (after their batch
    norm) and fc7 (a dilated 3x3 and a 1x1 convolution in place of VGG's fc6/fc7)."""

    def __init__(self):
        super().__init__()
        f = _vgg16_bn_features(_VGG16)
        self.slice1 = Layers(f[0:12])
        self.slice2 = Layers(f[12:19], 12)
        self.slice3 = Layers(f[19:29], 19)
        self.slice4 = Layers(f[29:39], 29)
        self.slice5 = Layers([max_pool(3, 1, 1),
                              Conv2d(512, 1024, 3, padding=6, dilation=6),
                              Conv2d(1024, 1024, 1)])

    def forward(self, x):
        h2 = self.slice1(x)
        h3 = self.slice2(h2)
        h4 = self.slice3(h3)
        h5 = self.slice4(h4)
        fc7 = self.slice5(h5)
        if self._fused:     # slices 1-3 end with that ReLU
            return fc7, h5, h4, h3, h2
        # the in-place ReLU opening slices 2-4 reaches h2, h3, h4 (see the module docstring)
        return fc7, h5, F.relu(h4), F.relu(h3), F.relu(h2)

    _fused = False

    def fuse(self):
        """Layers.fuse on every slice, after moving the ReLU that opens slices 2-4 to the
        end of slices 1-3 (so it is fused into their last convolution): the skips are
        seen after it, as torchvision's in-place ReLU has them."""
        slices = (self.slice1, self.slice2, self.slice3, self.slice4, self.slice5)
        for a, b in zip(slices[:3], slices[1:4]):
            if b._plan[0] is not relu:
                raise ValueError("VGG16BN.fuse: slices 2-4 must open with a ReLU")
            a._plan.append(b._plan.pop(0))
        for s in slices:
            s.fuse()
        self._fused = True
        return self


class DoubleConv(nn.Module):
    def __init__(self, in_ch, mid_ch, out_ch):
        super().__init__()
        self.conv = Layers([Conv2d(in_ch + mid_ch, mid_ch, 1), nn.BatchNorm2d(mid_ch), relu,
                            Conv2d(mid_ch, out_ch, 3, padding=1), nn.BatchNorm2d(out_ch),
                            relu])

    def forward(self, x):
        return self.conv(x)


class CRAFT(nn.Module):
    """forward(x: (N, 3, H, W), normalised, H and W multiples of 32) -> (N, H/2, W/2, 2):
    region score, affinity score (the head's values are used as scores directly, as in
    CRAFT). The weights of CRAFT() are uninitialised: build it with from_file."""

    def __init__(self):
        super().__init__()
        self.basenet = VGG16BN()
        self.upconv1 = DoubleConv(1024, 512, 256)
        self.upconv2 = DoubleConv(512, 256, 128)
        self.upconv3 = DoubleConv(256, 128, 64)
        self.upconv4 = DoubleConv(128, 64, 32)
        self.conv_cls = Layers([Conv2d(32, 32, 3, padding=1), relu,
                                Conv2d(32, 32, 3, padding=1), relu,
                                Conv2d(32, 16, 3, padding=1), relu,
                                Conv2d(16, 16, 1), relu,
                                Conv2d(16, 2, 1)])

    def fuse(self):
        """Fold the batch norms and fuse the ReLUs of every part (Layers.fuse)."""
        self.basenet.fuse()
        for part in (self.upconv1, self.upconv2, self.upconv3, self.upconv4):
            part.conv.fuse()
        self.conv_cls.fuse()
        return self

    def forward(self, x):
        if x.ndim != 4 or x.shape[1] != 3 or x.shape[2] % 32 or x.shape[3] % 32:
            raise ValueError(f"CRAFT: input must be (N, 3, H, W) with H and W multiples of 32, "
                             f"got shape {tuple(x.shape)}")
        # channels-last from the first layer on: the convolutions read and write it uncopied
        # (the GPU kernels; on cpu the GEMMs write their rows in place), pooling and
        # resampling keep it, so no layer converts layouts
        x = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
        fc7, h5, h4, h3, h2 = self.basenet(x)
        y = self.upconv1(cat_channels([fc7, h5]))
        for up, skip in ((self.upconv2, h4), (self.upconv3, h3), (self.upconv4, h2)):
            y = F.interpolate(y, size=tuple(skip.shape[2:]), mode="bilinear", align_corners=False)
            y = up(cat_channels([y, skip]))
        return self.conv_cls(y).permute(0, 2, 3, 1)


    @classmethod
    def from_file(cls, path, device=None, dtype=None):
        return load_state(cls(), path, device, dtype)

    def detect(self, image, *, canvas_size=2560, mag_ratio=1.0, text_threshold=0.7,
               low_text=0.4, link_threshold=0.4, run=None):
        """image: (H, W, 3) uint8 RGB -> (boxes, region, affinity): boxes a list of (4, 2)
        float arrays of corner points (clockwise from the top-left) in image coordinates;
        region and affinity the score maps (float32, at half the network's input size).
        run: what computes the network (default self; nbx.cuda.graphed(self) replays it)."""
        from .ocr import detection_boxes
        x, ratio = detector_input(image, canvas_size, mag_ratio)
        p = next(self.parameters())
        from ..creation import from_numpy
        y = (run or self)(from_numpy(x).to(device=p.device, dtype=p.dtype))
        maps = y[0].float().numpy()
        region, affinity = maps[..., 0], maps[..., 1]
        boxes = detection_boxes(region, affinity, text_threshold, link_threshold, low_text)
        return [b * (2.0 / ratio) for b in boxes], region, affinity


def _is_channels_last(t):
    return t.stride(1) == 1 and t.permute(0, 2, 3, 1).is_contiguous()


def cat_channels(ts):
    """cat(ts, dim=1), channels-last when every input is (cat's own result is NCHW, which
    the next convolution would convert back)."""
    if not all(_is_channels_last(t) for t in ts):
        return _ops.cat(ts, 1)
    from ..creation import empty
    n, _, h, w = ts[0].shape
    out = empty((n, h, w, sum(t.shape[1] for t in ts)), dtype=ts[0].dtype,
                device=ts[0].device)
    c0 = 0
    for t in ts:
        out.narrow(3, c0, t.shape[1]).copy_(t.permute(0, 2, 3, 1))
        c0 += t.shape[1]
    return out.permute(0, 3, 1, 2)


def detector_input(image, canvas_size=2560, mag_ratio=1.0):
    """EasyOCR's preparation: scale so the long side is mag_ratio times itself but at most
    canvas_size, paste on a black canvas whose sides are multiples of 32, normalise with
    the ImageNet mean and deviation. -> ((1, 3, H32, W32) float32, the scale used)."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"detector input must be an (H, W, 3) uint8 RGB array, got "
                         f"{image.dtype} {image.shape}")
    h, w = image.shape[:2]
    target = min(mag_ratio * max(h, w), canvas_size)
    ratio = target / max(h, w)
    th, tw = max(1, int(h * ratio)), max(1, int(w * ratio))
    if (th, tw) != (h, w):
        from PIL import Image
        image = np.asarray(Image.fromarray(image).resize((tw, th), Image.BILINEAR))
    canvas = np.zeros((math.ceil(th / 32) * 32, math.ceil(tw / 32) * 32, 3), np.float32)
    canvas[:th, :tw] = image
    canvas -= np.float32(255) * np.array(MEAN, np.float32)
    canvas /= np.float32(255) * np.array(STD, np.float32)
    return np.ascontiguousarray(canvas.transpose(2, 0, 1)[None]), ratio


def load_state(model, path, device=None, dtype=None):
    """Load a torch checkpoint (DataParallel `module.` prefix stripped) into `model`, put it
    in eval mode, fuse it for inference (`model.fuse()`: batch norms folded, ReLUs in the
    convolutions' pass) and put it on `device` in `dtype`."""
    from ..io import load_torch
    sd = load_torch(path)
    if not isinstance(sd, dict):
        raise ValueError(f"checkpoint {str(path)!r} holds a {type(sd).__name__}, not a state dict")
    sd = {k[len("module."):] if k.startswith("module.") else k: v for k, v in sd.items()}
    model.load_state_dict(sd)
    model.eval()
    model.fuse()
    if device is not None or dtype is not None:
        model.to(device=device, dtype=dtype)
    if next(model.parameters()).device.type != "cpu":
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                _taps_major(m)
    return model
