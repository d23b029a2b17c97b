"""Thin command-line front ends: parse flags, load configuration, wire objects, run."""
