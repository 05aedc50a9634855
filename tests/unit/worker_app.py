"""A ClientApp for the worker tests: train doubles the model, counts calls in context.state,
fails on request, reports which process ran it, and on request how many modules its
first torch training step imported."""

from __future__ import annotations

import os
import sys
from typing import cast

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from workloads.sdk import to_numpy, to_record

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content.config_records["config"]
    if config.get("fail"):
        raise ValueError(f"asked to fail on {context.node_config['cluster-name']}")
    if config.get("optimizer"):
        import torch

        before = set(sys.modules)
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.autograd.backward(model(torch.ones(3, 4)).sum())  # autograd works after the fork
        optimizer.step()
        new_modules = len(set(sys.modules) - before)
        metrics = MetricRecord({"new-modules": new_modules})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)
    count = cast(int, context.state.config_records.get("calls", ConfigRecord({"n": 0}))["n"])
    calls = int(count) + 1
    context.state["calls"] = ConfigRecord({"n": calls})
    arrays = to_numpy(msg.content.array_records["arrays"])
    content = RecordDict(
        {
            "arrays": to_record({k: v * 2 for k, v in arrays.items()}),
            "metrics": MetricRecord({"num-examples": 3, "pid": os.getpid(), "calls": calls}),
        }
    )
    return Message(content, reply_to=msg)
