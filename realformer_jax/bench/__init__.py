"""The train steps under measurement: the project's, with our model or Hugging Face's (steps),
compiled with their state, memory figures and the device's high-water mark (compiled_steps).
Inside the package because an installed command times them (realformer-device-check's training
and table parts); the repository's benchmarks/ build on them too. Light: importing the package
imports no submodule."""
