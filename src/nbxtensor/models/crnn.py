"""The CRNN text-line recogniser of EasyOCR's second generation ('english_g2.pth').

A VGG-style feature extractor turns a grey line image of height 64 into a feature map of
height 3 and width W/4 - 1; its mean over the height is a sequence of 256-d features,
read by two bidirectional LSTM layers (each an LSTM followed by a linear projection) and
a final linear layer to the character classes (class 0 is the CTC blank). Parameter names
are EasyOCR's, so the checkpoint loads with its `module.` prefix stripped.
"""
from __future__ import annotations

from .. import nn
from .craft import Layers, from_checkpoint, load_state, max_pool, relu

__all__ = ["CRNN", "ENGLISH_G2_CHARACTERS", "HEIGHT"]

HEIGHT = 64        # the line height the recogniser was trained on (EasyOCR's imgH)
# english_g2's classes 1..96 in order (EasyOCR's config.py); class 0 is the CTC blank
ENGLISH_G2_CHARACTERS = ("0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ \u20ac"
                         "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")

Conv2d = from_checkpoint(nn.Conv2d)
Linear = from_checkpoint(nn.Linear)
LSTM = from_checkpoint(nn.LSTM)


def _vgg_extractor(c_in, c):
    c1, c2, c3 = c // 8, c // 4, c // 2
    return Layers([Conv2d(c_in, c1, 3, 1, 1), relu, max_pool(2, 2),
                   Conv2d(c1, c2, 3, 1, 1), relu, max_pool(2, 2),
                   Conv2d(c2, c3, 3, 1, 1), relu,
                   Conv2d(c3, c3, 3, 1, 1), relu, max_pool((2, 1), (2, 1)),
                   Conv2d(c3, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), relu,
                   Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), relu,
                   max_pool((2, 1), (2, 1)),
                   Conv2d(c, c, 2, 1, 0), relu])


class _Extractor(nn.Module):
    def __init__(self, c_in, c):
        super().__init__()
        self.ConvNet = _vgg_extractor(c_in, c)

    def forward(self, x):
        return self.ConvNet(x)


class BidirectionalLSTM(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super().__init__()
        self.rnn = LSTM(input_size, hidden_size, bidirectional=True, batch_first=True)
        self.linear = Linear(hidden_size * 2, output_size)

    def forward(self, x):
        return self.linear(self.rnn(x)[0])


class CRNN(nn.Module):
    """forward(x: (N, 1, 64, W) in [-1, 1], W >= 8) -> logits (N, W // 4 - 1, classes).
    The weights of CRNN() are uninitialised: build it with from_file."""

    def __init__(self, num_class=len(ENGLISH_G2_CHARACTERS) + 1, input_channel=1,
                 output_channel=256, hidden_size=256):
        super().__init__()
        self.FeatureExtraction = _Extractor(input_channel, output_channel)
        self.SequenceModeling = nn.Sequential(
            BidirectionalLSTM(output_channel, hidden_size, hidden_size),
            BidirectionalLSTM(hidden_size, hidden_size, hidden_size))
        self.Prediction = Linear(hidden_size, num_class)

    def fuse(self):
        """Fold the batch norms and fuse the ReLUs of the feature extractor (Layers.fuse)."""
        self.FeatureExtraction.ConvNet.fuse()
        return self

    def forward(self, x):
        if x.ndim != 4 or x.shape[1] != 1 or x.shape[2] != HEIGHT or x.shape[3] < 8:
            raise ValueError(f"CRNN: input must be (N, 1, {HEIGHT}, W) with W >= 8, got shape "
                             f"{tuple(x.shape)}")
        f = self.FeatureExtraction(x)                     # (N, C, 3, W/4 - 1)
        seq = f.mean(2).permute(0, 2, 1)                  # EasyOCR's AdaptiveAvgPool((None, 1))
        return self.Prediction(self.SequenceModeling(seq))

    @classmethod
    def from_file(cls, path, device=None, dtype=None):
        return load_state(cls(), path, device, dtype)
