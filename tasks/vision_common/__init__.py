"""What the image tasks (classification, segmentation, the vision-language tasks) share."""
