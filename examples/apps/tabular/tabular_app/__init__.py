"""Logistic regression on tabular data: a Flower app for the ocm-fl platform."""
