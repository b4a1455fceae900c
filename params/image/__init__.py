"""Image-classification experiments: AmoebaNet on ImageNet, fine-tuned from it on the Table 4 sets, and on the bundled digits."""
