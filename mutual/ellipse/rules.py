"""Which of OpenCV's fits made an ellipse: the `rule` of `prompts.concept_ellipses` and
`prompts.padded_ellipses`.
"""

from __future__ import annotations


# Which of OpenCV's fits made an ellipse (the `rule` of concept_ellipses and padded_ellipses):
# FITTED: fitEllipse's least squares; DIRECT: its direct fit of exactly 5 points (padded ones
# included), first attempt; DIRECT_RETRIED: the direct fit redone on points moved by
# cv::theRNG() (the first attempt's determinant was round-off); DIRECT_FALLBACK: both attempts
# singular, the 5 points' least squares; DEGENERATE: least squares on points moved by
# cv::theRNG() (a degenerate design). The rest get a zero-size ellipse at the centroid of the
# contour's points: FEW_POINTS (under 5 points unpadded, or padding the reference cannot draw:
# randint(0, -1) raises), UNDRAWABLE (OpenCV's box has a size that is not a number: cv2.ellipse
# raises in the reference), UNLISTED (a degenerate contour longer than the points listed in
# order, which no digital contour is) and ABSENT (no region).
(
  FITTED,
  FEW_POINTS,
  DIRECT_RETRIED,
  DEGENERATE,
  ABSENT,
  DIRECT,
  DIRECT_FALLBACK,
  UNDRAWABLE,
  UNLISTED,
) = range(9)
#: The rules where the reference has no ellipse (it raises there).
REFERENCE_FAILS = (FEW_POINTS, UNDRAWABLE)
