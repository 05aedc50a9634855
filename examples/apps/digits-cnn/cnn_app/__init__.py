"""Digits CNN started from a pretrained .pth: a Flower app for the ocm-fl platform."""
