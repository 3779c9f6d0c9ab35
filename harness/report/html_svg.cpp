#include "harness/report/html_svg.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "harness/report/timeline_view.hpp"
#include "shardscope/format.hpp"

namespace shardscope::html {
namespace {

// Tableau 10: a category and its unsharded twin share a hue, dark and light.
constexpr std::array<const char*, kCategoryCount> kCategoryColors = {
    "#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f", "#e15759", "#b07aa1", "#9c755f", "#edc948",
    "#76b7b2", "#ff9da7"};
constexpr std::array<const char*, 8> kStageColors = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                                     "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"};

std::string swatch(const char* fill, std::string_view name) {
  return std::string("<span class=\"key\"><i style=\"background:") + fill + "\"></i>" +
         escape(name) + "</span>";
}

}  // namespace

namespace {

// The length of the well-formed UTF-8 sequence at text[i] (RFC 3629: no overlong forms,
// no surrogates, nothing above U+10FFFF), or 0 when the bytes there are not one.
std::size_t utf8_length(std::string_view text, std::size_t i) {
  const auto at = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b = at(i);
  if (b < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) n = 2;
  else if (b >= 0xE0 && b <= 0xEF) n = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
  else if (b >= 0xF0 && b <= 0xF4) n = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
  else return 0;
  if (i + n > text.size() || at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (at(i + k) < 0x80 || at(i + k) > 0xBF) return 0;
  return n;
}

}  // namespace

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_length(text, i);
    if (n == 0) {  // a byte that is not UTF-8 (a file name's, say): U+FFFD, as the JSON has it
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    switch (text[i]) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += text[i];
    }
    ++i;
  }
  return out;
}

std::string num(double v) {
  if (!std::isfinite(v)) return "0";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", std::round(v * 10.0) / 10.0);
  std::string s = buf;
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s == "-0" ? "0" : s;
}

const char* category_color(std::size_t i) { return kCategoryColors[i % kCategoryColors.size()]; }
const char* stage_color(std::size_t s) { return kStageColors[s % kStageColors.size()]; }

const char* action_color(char kind) {
  switch (kind) {
    case 'F': return "#4e79a7";
    case 'B': return "#f28e2b";
    case 'W': return "#59a14f";
    default: return "#bab0ac";
  }
}

const char* phase_color(const std::string& phase) {
  if (phase == "forward") return "#cfe0f1";
  if (phase == "backward") return "#fcdcbc";
  if (phase == "optimizer") return "#cfe8ca";
  if (phase == "communication") return "#e8d6e4";
  return "#e4e4e4";
}

std::vector<double> nice_ticks(double max, int target) {
  if (!(max > 0.0) || !std::isfinite(max)) return {0.0, 1.0};
  const double raw = max / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  for (int i = 0; i <= 1000; ++i) {
    const double t = step * i;
    ticks.push_back(t);
    if (t >= max * (1.0 - 1e-9)) break;
  }
  return ticks;
}

std::string ms_label(double v, double step) {
  int decimals = 0;
  while (decimals < 6 && step * std::pow(10.0, decimals) < 0.999) ++decimals;
  if (decimals < 6 && std::fabs(step * std::pow(10.0, decimals) - std::round(step * std::pow(10.0, decimals))) > 1e-6)
    ++decimals;  // 2.5 -> one decimal
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::vector<double> nice_byte_ticks(double max, int target) {
  double unit = 1.0;
  while (unit < 1024.0 * 1024.0 * 1024.0 * 1024.0 && max / unit >= 1024.0) unit *= 1024.0;
  std::vector<double> ticks = nice_ticks(max / unit, target);
  for (double& t : ticks) t *= unit;
  return ticks;
}

std::string bytes_label(double v) {
  // "8.00 MiB" -> "8 MiB", "2.50 MiB" -> "2.5 MiB": axis labels, not figures.
  std::string s = format_bytes_short(static_cast<std::int64_t>(std::llround(v)));
  const std::size_t dot = s.find('.'), space = s.find(' ');
  if (dot == std::string::npos || space == std::string::npos || dot > space) return s;
  std::size_t end = space;
  while (end > dot + 1 && s[end - 1] == '0') --end;
  if (end == dot + 1) end = dot;
  return s.substr(0, end) + s.substr(space);
}

Svg::Svg(double width, double height, const std::string& css_class, const std::string& label) {
  out_ = "<svg class=\"" + escape(css_class) + "\" viewBox=\"0 0 " + num(width) + " " + num(height) +
         "\" width=\"" + num(width) + "\" height=\"" + num(height) + "\" role=\"img\" aria-label=\"" +
         escape(label) + "\">";
}

void Svg::rect(double x, double y, double w, double h, const std::string& fill, const std::string& extra) {
  out_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(0.0, w)) + "\" height=\"" +
          num(std::max(0.0, h)) + "\" fill=\"" + fill + "\"" + (extra.empty() ? "" : " " + extra) + "/>";
}

void Svg::line(double x1, double y1, double x2, double y2, const std::string& stroke, const std::string& extra) {
  out_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" + num(y2) +
          "\" stroke=\"" + stroke + "\"" + (extra.empty() ? "" : " " + extra) + "/>";
}

void Svg::text(double x, double y, std::string_view content, const std::string& extra) {
  out_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"" + (extra.empty() ? "" : " " + extra) + ">" +
          escape(content) + "</text>";
}

void Svg::path(const std::string& d, const std::string& fill, const std::string& extra) {
  out_ += "<path d=\"" + d + "\" fill=\"" + fill + "\"" + (extra.empty() ? "" : " " + extra) + "/>";
}

void Svg::begin_group(const std::string& attrs, std::string_view tip) {
  out_ += "<g" + (attrs.empty() ? "" : " " + attrs) + ">";
  ++open_groups_;
  if (!tip.empty()) title(tip);
}

void Svg::end_group() {
  if (open_groups_ == 0) return;
  out_ += "</g>";
  --open_groups_;
}

void Svg::title(std::string_view tip) { out_ += "<title>" + escape(tip) + "</title>"; }

void Svg::bytes_axis(double x_left, double x_right, double y0, double scale, const std::vector<double>& ticks) {
  for (double v : ticks) {
    const double y = y0 - v * scale;
    line(x_left, y, x_right, y, "#ddd");
    text(x_left - 4, y + 4, bytes_label(v), "class=\"yl\"");
  }
  line(x_left, y0, x_right, y0, "#888");
}

void Svg::time_axis(double x0, double t0, double scale, double y, const std::vector<double>& ticks) {
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1.0;
  for (double t : ticks) {
    const double x = x0 + (t - t0) * scale;
    line(x, y, x, y + 4, "#888");
    text(x, y + 15, ms_label(t, step), "class=\"xl\"");
  }
}

std::string Svg::str() const {
  std::string closed = out_;
  for (int i = 0; i < open_groups_; ++i) closed += "</g>";
  return closed + "</svg>";
}

std::string category_legend() {
  std::string out = "<div class=\"legend\">";
  for (std::size_t i = 0; i < kCategoryNames.size(); ++i) out += swatch(category_color(i), kCategoryNames[i]);
  out += "<span class=\"key\"><b class=\"tick\"></b>predicted</span></div>";
  return out;
}

std::string action_legend() {
  return "<div class=\"legend\">" + swatch(action_color('F'), "F forward") + swatch(action_color('B'), "B backward") +
         swatch(action_color('W'), "W weight gradient") +
         swatch("repeating-linear-gradient(135deg,#c9c9c9 0 2px,#f4f4f4 2px 5px)", "bubble (stage idle)") + "</div>";
}

}  // namespace shardscope::html
