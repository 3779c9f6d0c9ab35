// Enough of PNG to tell a painted page from a blank one: the signature and IHDR always;
// with zlib (SHARDSCOPE_TEST_ZLIB) the pixels too, 8-bit RGB or RGBA, not interlaced,
// all five filters: how much is not white, how many colours, and how many pixels have
// each of a few chart colours exactly (flat SVG fills are painted exactly).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#ifdef SHARDSCOPE_TEST_ZLIB
#include <zlib.h>
#endif

namespace shardscope::testing {

struct PngColor {
  const char* name;
  std::uint32_t rgb;
};
// The report's fills of param, grad, optim and param_unsharded (html_svg.cpp).
inline const std::array<PngColor, 4> kPngColors = {
    {{"param", 0x4e79a7}, {"grad", 0xf28e2b}, {"optim", 0x59a14f}, {"param_unsharded", 0xa0cbe8}}};

struct PngCheck {
  bool ok = false;
  std::string error;
  std::uint32_t width = 0, height = 0;
  bool decoded = false;  // the pixel figures below are filled
  double non_white_fraction = 0.0;
  std::size_t distinct_colors = 0;  // counted up to 100,000
  std::array<std::size_t, 4> pixels_of{};
};

inline std::uint32_t png_be32(const std::string& s, std::size_t at) {
  return (std::uint32_t(std::uint8_t(s[at])) << 24) | (std::uint32_t(std::uint8_t(s[at + 1])) << 16) |
         (std::uint32_t(std::uint8_t(s[at + 2])) << 8) | std::uint32_t(std::uint8_t(s[at + 3]));
}

inline PngCheck check_png(const std::string& png) {
  PngCheck r;
  static const char kSig[] = "\x89PNG\r\n\x1a\n";
  if (png.size() < 33 || png.compare(0, 8, kSig, 8) != 0) {
    r.error = "not a PNG file";
    return r;
  }
  if (png.compare(12, 4, "IHDR") != 0) {
    r.error = "no IHDR chunk first";
    return r;
  }
  r.width = png_be32(png, 16);
  r.height = png_be32(png, 20);
  const int depth = std::uint8_t(png[24]), type = std::uint8_t(png[25]), interlace = std::uint8_t(png[28]);
  std::string idat;
  for (std::size_t at = 8; at + 8 <= png.size();) {
    const std::uint32_t len = png_be32(png, at);
    if (at + 12 + len > png.size()) {
      r.error = "truncated chunk";
      return r;
    }
    if (png.compare(at + 4, 4, "IDAT") == 0) idat.append(png, at + 8, len);
    at += 12 + len;
  }
  if (idat.empty()) {
    r.error = "no image data";
    return r;
  }
  r.ok = true;
#ifdef SHARDSCOPE_TEST_ZLIB
  const std::size_t channels = type == 2 ? 3 : type == 6 ? 4 : 0;
  if (depth != 8 || channels == 0 || interlace != 0) return r;  // not what Chromium writes: no pixels
  const std::size_t stride = r.width * channels;
  std::vector<std::uint8_t> raw((stride + 1) * r.height);
  uLongf raw_size = raw.size();
  if (uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) != Z_OK ||
      raw_size != raw.size()) {
    r.ok = false;
    r.error = "image data does not inflate to " + std::to_string(raw.size()) + " bytes";
    return r;
  }
  std::vector<std::uint8_t> prev(stride, 0), cur(stride);
  std::unordered_set<std::uint32_t> colors;
  std::size_t non_white = 0;
  for (std::uint32_t y = 0; y < r.height; ++y) {
    const std::uint8_t* line = &raw[y * (stride + 1)];
    const int filter = line[0];
    for (std::size_t i = 0; i < stride; ++i) {
      const int a = i >= channels ? cur[i - channels] : 0, b = prev[i], c = i >= channels ? prev[i - channels] : 0;
      int pred = 0;
      if (filter == 1) pred = a;
      else if (filter == 2) pred = b;
      else if (filter == 3) pred = (a + b) / 2;
      else if (filter == 4) {
        const int p = a + b - c, pa = p > a ? p - a : a - p, pb = p > b ? p - b : b - p, pc = p > c ? p - c : c - p;
        pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      cur[i] = std::uint8_t(line[1 + i] + pred);
    }
    for (std::size_t x = 0; x < r.width; ++x) {
      const std::uint8_t* px = &cur[x * channels];
      const std::uint32_t rgb = (std::uint32_t(px[0]) << 16) | (std::uint32_t(px[1]) << 8) | px[2];
      if (rgb != 0xffffff) ++non_white;
      if (colors.size() < 100000) colors.insert(rgb);
      for (std::size_t k = 0; k < kPngColors.size(); ++k) r.pixels_of[k] += rgb == kPngColors[k].rgb;
    }
    prev.swap(cur);
  }
  r.decoded = true;
  r.non_white_fraction = double(non_white) / (double(r.width) * r.height);
  r.distinct_colors = colors.size();
#else
  (void)depth, (void)type, (void)interlace;
#endif
  return r;
}

}  // namespace shardscope::testing
