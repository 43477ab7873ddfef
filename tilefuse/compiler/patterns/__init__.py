"""Graph passes that run on the Dynamo graph before AOTAutograd and replace a recognised region with a call of a
kernel family (:mod:`.attention`: attention -> the flash-attention family's custom ops)."""
