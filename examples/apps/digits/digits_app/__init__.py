"""Digits MLP: a Flower app for the ocm-fl platform."""
