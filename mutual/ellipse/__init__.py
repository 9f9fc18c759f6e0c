"""The reference's ellipse visual prompt, as OpenCV computes it, in JAX.

Per concept region the reference (utils.draw_circle_on_components_with_augments) takes the
outer contours of the region (cv2.findContours, RETR_EXTERNAL, CHAIN_APPROX_NONE), keeps the one
with the largest polygon area (cv2.contourArea, holes ignored), fits cv2.fitEllipse to its
points, and draws the ellipse with cv2.ellipse: a 1-pixel red stroke on the image, and a filled
ellipse as the mask outside which the image is made grayscale (cv2.cvtColor) or blurred
(cv2.GaussianBlur, 11 x 11). This package reproduces each step for fixed shapes, batched over
images and concepts, with no loop over pixels, one module per role:

* `contours`: the largest outer contour (Suzuki-Abe's border following as a permutation of
  border states, labelled by pointer doubling).
* `least_squares`: fitEllipse's default fit (fitEllipseNoDirect) of a contour's points.
* `direct_fit`: the fits that need the points in OpenCV's order: fitEllipseDirect on exactly 5
  points, operation for operation, and least squares on points moved by cv::theRNG();
  `eigen`: cv::eigenNonSymmetric as it runs there; `floats`: 64-bit tracing and the rounding
  fences that keep the compiler from fusing or rewriting products and quotients.
* `random_replay`: the two random streams the reference reads (cv::theRNG()'s multiply with
  carry, Python's Mersenne Twister), replayed from words computed on the host.
* `drawing`: cv2.ellipse's fixed-point polygon, line and convex fill.
* `pixels`: grayscale, Gaussian blur, the reference's uint8 round trip, the prompted images.
* `prompts`: the steps put together per region under the reference's seeding protocol
  (`prompts.padded_ellipses`, `prompts.reference_prompts`); `rules`: which fit made an ellipse.

Callers import the role modules (`from mutual.ellipse import prompts`); a test that patches a
function patches it in the module that holds it, where its callers look it up.

Short contours. A largest contour of under 5 points is padded as the reference pads it, with
random.randint(0, last_x - 1), random.randint(0, last_y - 1) per missing point from Python's
`random` seeded anew before each image's concepts of each method (prompts.padded_ellipses;
random_replay.reference_padding replays the Mersenne Twister words), and 5 points get OpenCV's
direct fit (fitEllipseDirect), as natural 5-point contours do.

OpenCV's random paths (4.12). fitEllipseDirect reads cv::theRNG() on every call: its first
attempt moves the 5 points by getOfs(0) (10 words, values unused); where the attempt's reduced
scatter matrix has |det M| <= 1e-10 (it is singular in exact arithmetic for 5 points, so this
is round-off) it retries on points moved by getOfs(s / 10 * 1e-2) (10 more words), and where
that is singular too it falls back to fitEllipseNoDirect. fitEllipseNoDirect moves the points
by getOfs(s / (2 n) * 1e-3) (2 words a point) where its design matrix is degenerate
(w0 * FLT_EPSILON > w4: collinear points, or fewer than 6 distinct ones). cv::theRNG() is a
multiply-with-carry generator (state = (uint64)(unsigned)state * 4164903690 + (state >> 32))
whose state carries from fit to fit; under the protocol it is seeded (cv2.setRNGSeed) with the
same seed as Python's `random` before each image's concepts of each method, and the words each
region reads start where the concepts visited before it in its map stopped
(random_replay.opencv_rng_words, prompts._context_cursors). The moved points and the direct fit
are reproduced exactly; the degenerate least squares solves on LAPACK's SVD (OpenCV runs its
Jacobi SVD), so it can differ from OpenCV by round-off.

Where the reference raises, a deterministic rule gives a zero-size ellipse at the centroid of
the contour's points (which OpenCV would draw as the one pixel nearest to it, stroke and mask
alike): padding the reference cannot draw (a last point with a 0 coordinate: randint(0, -1)
raises; no word is read), and a box whose size is not a number (cv2.ellipse asserts on it).
prompts.concept_ellipses, which fits masks on their own, pads nothing (contours under 5 points
get the same rule) and seeds cv::theRNG() before each fit.

The contours run in 32-bit types. The fit needs float64 and the rasteriser int64 (OpenCV's
fixed-point products exceed 32 bits), so those steps are jitted functions that are traced and
compiled with 64-bit types switched on (`jax.enable_x64` around the call: a program lowered
with them off would truncate them); they take and return 32-bit arrays. Call them from Python,
not from inside another jit.
"""
