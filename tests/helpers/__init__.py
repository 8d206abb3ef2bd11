"""What the tests share: subprocess runners, browser driving, tiny runs, torchrun."""
