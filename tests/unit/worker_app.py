"""A ClientApp for the worker tests: train doubles the model, counts calls in context.state,
fails on request, and reports which process ran it."""

from __future__ import annotations

import os

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from workloads.sdk import to_numpy, to_record

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content.config_records["config"]
    if config.get("fail"):
        raise ValueError(f"asked to fail on {context.node_config['cluster-name']}")
    calls = int(context.state.config_records.get("calls", ConfigRecord({"n": 0}))["n"]) + 1
    context.state["calls"] = ConfigRecord({"n": calls})
    arrays = to_numpy(msg.content.array_records["arrays"])
    content = RecordDict(
        {
            "arrays": to_record({k: v * 2 for k, v in arrays.items()}),
            "metrics": MetricRecord({"num-examples": 3, "pid": os.getpid(), "calls": calls}),
        }
    )
    return Message(content, reply_to=msg)
