"""Reading what users hand the media verbs: audio and images, in bounded memory and time.

Every verb and the Space read files through here: only regular files are opened
(:mod:`~hub_export.media.files`), audio streams window by window with its header checked before
anything is allocated (:mod:`~hub_export.media.audio`), and images are decoded at no more
than the size a model needs, within a pixel budget checked from the header
(:mod:`~hub_export.media.images`). Each bad file is one :class:`~hub_export.errors.InputError`.
"""
