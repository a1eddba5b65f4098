# Corpus of CUDA idioms, written the way the libraries write them. "# site: <kinds>" marks
# each line the rewriter must change; tests/unit/test_rewrite.py reads these markers.
# fmt: off
"""``torch.inference_mode`` in every form libraries use it (ultralytics, transformers'
pipelines, whisper's ``transcribe``)."""

import functools

import torch
from torch import nn

model = nn.Linear(3, 2)
nn.init.constant_(model.weight, 0.5)
nn.init.zeros_(model.bias)


@torch.inference_mode()  # site: inference_mode
def predict(x):
    return model(x)


@torch.inference_mode  # site: inference_mode
def predict_bare(x):
    return model(x)


def smart_inference_mode():
    def decorate(fn):
        if torch.is_inference_mode_enabled():
            return fn
        return (torch.inference_mode if True else torch.no_grad)()(fn)  # site: inference_mode

    return decorate


@smart_inference_mode()
def predict_smart(x):
    return model(x)


@torch.inference_mode()  # site: inference_mode
def stream(batches):
    for batch in batches:
        received = yield model(batch)
        if received is not None:
            yield received * 2


def train_inside(x):
    with torch.inference_mode(mode=False), torch.enable_grad():  # site: inference_mode
        return model(x).sum()


def run() -> dict:
    x = torch.ones(2, 3)
    with torch.inference_mode():  # site: inference_mode
        inside = model(x)
        grad_inside = torch.is_grad_enabled()
    steps = stream([x, x])
    first = next(steps)
    sent = steps.send(torch.ones(1))
    loss = train_inside(x)
    return {
        "inside": inside.tolist(),
        "inside_is_inference": inside.is_inference(),
        "grad_inside": grad_inside,
        "grad_after": torch.is_grad_enabled(),
        "decorated": [f(x).tolist() for f in (predict, predict_bare, predict_smart)],
        "decorated_grad": [f(x).requires_grad for f in (predict, predict_bare, predict_smart)],
        "stream": [first.tolist(), sent.tolist()],
        "trains_inside": loss.requires_grad,
        "wrapped_name": predict.__name__,
        "partial": functools.partial(predict, x)().tolist(),
    }
