"""A model of `params` float32 numbers that "trains" by adding a known step, so the size of
what travels is set by the run config and the aggregate can be checked exactly.

The numbers start as seeded uniform values in [0, 1), not zeros: Flower stores and sends a
message's 5 MiB chunks by their content's hash, so a model of equal numbers would cross the
wire as a single chunk. Client i (its node config's cluster name ends in a digit i) adds i / 10
to every number and reports one example; after FedAvg over clients 1 and 2 every number has
grown by 0.15 per round. The ServerApp checks that on the final model, layer by layer against
the same seeded values, so a corrupted or truncated transfer fails the run. With run config
`wire-dtype = "float16"` the model travels as float16 both ways (the client takes it through
the SDK's `wire_format` mod) and the check allows float16's rounding."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from flwr.serverapp import Grid, ServerApp

from workloads.sdk import FedAvg, ServerPlatform, cluster_name, run_strategy, wire_format


def wire_bits(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Mod outside `wire_format`: put the bits per number of the arrays as they crossed the
    wire, both ways, in the reply's metrics (`wire-bits-in`, `wire-bits-out`), so a test can
    see what travelled."""

    def bits(record: ArrayRecord) -> int:
        return max((int(np.dtype(a.dtype).itemsize) * 8 for a in record.values()), default=0)

    received = bits(msg.content.array_records["arrays"]) if msg.has_content() else 0
    reply = call_next(msg, context)
    if reply.has_content() and not reply.has_error():
        metrics = next(iter(reply.content.metric_records.values()))
        metrics["wire-bits-in"] = received
        metrics["wire-bits-out"] = bits(next(iter(reply.content.array_records.values())))
    return reply


server = ServerApp()
client = ClientApp(mods=[wire_bits, wire_format])


def sizes(params: int, layers: int) -> list[int]:
    """The numbers in each of `layers` arrays (the last takes the remainder)."""
    size, rest = divmod(params, layers)
    return [size + (rest if i == layers - 1 else 0) for i in range(layers)]


def start_values(layer: int, size: int) -> np.ndarray:
    """Layer `layer`'s starting numbers: uniform in [0, 1), seeded by the layer."""
    return np.random.default_rng(layer).random(size, dtype=np.float32)


def model(params: int, layers: int) -> ArrayRecord:
    """`params` numbers in `layers` arrays."""
    arrays = {f"layer{i}": Array(start_values(i, n)) for i, n in enumerate(sizes(params, layers))}
    return ArrayRecord(arrays)


def step(cluster: str) -> float:
    """What this cluster adds to every number: its trailing digit / 10."""
    digits = "".join(c for c in cluster if c.isdigit())
    return int(digits[-1] if digits else "1") / 10


@client.train()
def train(msg: Message, context: Context) -> Message:
    """Add this cluster's step to every array of the received model."""
    delta = np.float32(step(cluster_name(context)))
    received = msg.content.array_records["arrays"]
    out = ArrayRecord({k: Array(v.numpy() + delta) for k, v in received.items()})
    metrics = MetricRecord({"num-examples": 1})
    return Message(RecordDict({"arrays": out, "metrics": metrics}), reply_to=msg)


@server.main()
def main(grid: Grid, context: Context) -> None:
    """FedAvg through the platform's loop; then check every number of the final model."""
    config = context.run_config
    # On the platform its rounds (spec.server.rounds) win over the app default.
    rounds = ServerPlatform.from_env().rounds or int(config["num-server-rounds"])
    start = model(int(config["params"]), int(config["layers"]))
    wire = str(config.get("wire-dtype", "float32"))
    result = run_strategy(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0),
        grid,
        initial_arrays=start,
        num_rounds=rounds,
        wire_dtype=wire,
    )
    assert result.arrays is not None
    step_sum = np.float32(0.15 * rounds)
    # float16 keeps 11 significant bits: each round rounds twice (there and back).
    atol = 1e-4 if wire == "float32" else 1e-3 * rounds
    layers = sizes(int(config["params"]), int(config["layers"]))
    for i, (name, array) in enumerate(result.arrays.items()):
        values = array.numpy()
        want = start_values(i, layers[i]) + step_sum
        if values.dtype != np.float32 or not np.allclose(values, want, atol=atol):
            raise ValueError(f"{name}: expected {want[:3]} ..., got {values[:3]} ...")
