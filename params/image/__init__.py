"""Image-classification experiments: AmoebaNet on ImageNet and on the bundled digits."""
