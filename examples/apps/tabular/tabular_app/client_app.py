"""ClientApp: fits the global logistic regression on this cluster's table only."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from torch import nn

from workloads.sdk import PlatformClientApp, agent_metrics, data_dir

from .task import build_model, fit, load_data, number, score

# Scores the received model inside the train call when the server asks (evaluate-in-train).
app = PlatformClientApp(mods=[agent_metrics])


def _model(msg: Message, context: Context) -> nn.Module:
    model = build_model(int(number(context.run_config["features"])))
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    return model


@app.train()
def train_handler(msg: Message, context: Context) -> Message:
    """Fit on the local table, starting from the global model."""
    model = _model(msg, context)
    x, y = load_data(data_dir(context))
    config, node = context.run_config, context.node_config
    loss, accuracy = fit(
        model,
        x,
        y,
        epochs=int(number(node.get("local-epochs", config["local-epochs"]))),
        lr=number(node.get("lr", config["lr"])),
        batch_size=int(number(config["batch-size"])),
        l2=number(config["l2"]),
        seed=int(number(msg.content.config_records["config"]["server-round"])),
    )
    metrics = MetricRecord({"train-loss": loss, "train-accuracy": accuracy, "num-examples": len(y)})
    reply = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(reply, reply_to=msg)


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Log loss and accuracy of the global model on the local table."""
    x, y = load_data(data_dir(context))
    loss, accuracy = score(_model(msg, context), x, y)
    metrics = MetricRecord({"eval-loss": loss, "eval-accuracy": accuracy, "num-examples": len(y)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
