"""torch.nn's module classes, by family (the file names follow torch.nn.modules)."""
from __future__ import annotations

from .module import Buffer, Module, Parameter  # noqa: F401
from .activation import *  # noqa: F401,F403
from .attention import MultiheadAttention  # noqa: F401
from .container import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential  # noqa: F401
from .dropout import *  # noqa: F401,F403
from .flatten import Flatten, Unflatten  # noqa: F401
from .linear import Bilinear, Identity, Linear  # noqa: F401
from .normalization import *  # noqa: F401,F403
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell  # noqa: F401
from .sparse import Embedding, EmbeddingBag  # noqa: F401
from .conv import *  # noqa: F401,F403
from .pooling import *  # noqa: F401,F403
from .transformer import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .distance import CosineSimilarity, PairwiseDistance  # noqa: F401
from .padding import *  # noqa: F401,F403
# convolution, pooling and upsampling layers live in conv.py / pooling.py (their own family)
