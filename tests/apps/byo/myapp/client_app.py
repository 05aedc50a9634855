"""Runs on every cluster, next to its data."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn, optim

from workloads.sdk import agent_metrics, data_dir

from .model import accuracy, load, make_model

app = ClientApp(mods=[agent_metrics])  # the mod reports each reply's metrics to the hub


@app.train()
def train(msg: Message, context: Context) -> Message:
    model = make_model()
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    x, y = load(data_dir(context))  # this cluster's data, from its ClusterClaim
    lr = float(context.node_config.get("lr", context.run_config["lr"]))
    optimizer = optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for _ in range(5):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    metrics = {"loss": float(loss), "accuracy": accuracy(model, x, y), "num-examples": len(y)}
    content = RecordDict(
        {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}
    )
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    model = make_model()
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    x, y = load(data_dir(context))
    metrics = {"accuracy": accuracy(model, x, y), "num-examples": len(y)}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
