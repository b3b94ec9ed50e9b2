"""Where samples come from: folders, file lists, store prefixes, and the files beside each image."""
