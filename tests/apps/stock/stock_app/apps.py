"""ServerApp: Flower's FedAvg.start, as Flower's templates write it. ClientApp: least squares
on a small synthetic set per node. The platform must still show the rounds and each round's
values, which it can only learn from Flower's log."""

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

client = ClientApp()
server = ServerApp()
TRUE_W = np.array([2.0, -1.0, 0.5])


def _data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(64, 3))
    return x, x @ TRUE_W


def _weights(msg: Message) -> np.ndarray:
    return msg.content.array_records["arrays"].to_numpy_ndarrays()[0]


@client.train()
def train(msg: Message, context: Context) -> Message:
    w = _weights(msg)
    x, y = _data(context.node_id % 1000)
    for _ in range(3):
        w = w - 0.05 * (2 * x.T @ (x @ w - y) / len(y))
    loss = float(np.mean((x @ w - y) ** 2))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y)})
    return Message(RecordDict({"arrays": ArrayRecord([w]), "metrics": metrics}), reply_to=msg)


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    w = _weights(msg)
    x, y = _data(context.node_id % 1000 + 1)
    error = x @ w - y
    metrics = MetricRecord(
        {
            "eval_loss": float(np.mean(error**2)),
            "eval_acc": float(np.mean(np.abs(error) < 0.5)),
            "num-examples": len(y),
        }
    )
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


@server.main()
def main(grid: Grid, context: Context) -> None:
    rounds = int(context.run_config["num-server-rounds"])
    FedAvg().start(grid=grid, initial_arrays=ArrayRecord([np.zeros(3)]), num_rounds=rounds)
