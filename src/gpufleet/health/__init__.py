"""GPU failure prediction from telemetry: DCGM schema and readers, a fleet generator, window features,
models and ensembles (GBDT, MLP, LSTM, 1D-CNN; parallel and cascade), sliding training and evaluation."""
