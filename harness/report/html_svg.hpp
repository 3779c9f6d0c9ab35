// Building blocks of the HTML report (html_report.cpp): text escaping, numbers for SVG
// coordinates, the category and action colours, axes with round ticks, and a small
// string builder for one inline <svg>. Everything returned is safe to paste into HTML:
// text goes through escape(). No namespace URLs: inline SVG in HTML needs none.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardscope::html {

// & < > " ' as character references, and every byte that is not part of well-formed
// UTF-8 as U+FFFD (the page declares UTF-8; a file name in a command line may not be).
std::string escape(std::string_view text);

// A coordinate: one decimal, no trailing ".0" ("12", "12.5", "-3.2").
std::string num(double v);

// Fill colour of category i of kCategoryNames (sharded and unsharded share a hue).
const char* category_color(std::size_t i);
// Fill of a pipeline action: 'F', 'B', 'W'.
const char* action_color(char kind);
// Line colour of pipeline stage s.
const char* stage_color(std::size_t s);
// Fill of a phase strip segment: "forward", "backward", "optimizer", ... (grey otherwise).
const char* phase_color(const std::string& phase);

// About `target` round values covering [0, max] (0 first, max itself may be exceeded by
// the last tick so that the axis ends on a round value); {0, 1} when max <= 0.
std::vector<double> nice_ticks(double max, int target);
// The same for bytes, on binary steps (0, 2 MiB, 4 MiB, ...).
std::vector<double> nice_byte_ticks(double max, int target);
// A time tick in ms with as many decimals as the tick step needs ("0.005", "12", "1.5").
std::string ms_label(double v, double step);
// "0 B", "512 KiB", "2.5 MiB": bytes for an axis.
std::string bytes_label(double v);

// One <svg> element, built in order. Attributes in `extra` and `attrs` are pasted as
// they are (callers build them from constants and escape()); every text and title is
// escaped here.
class Svg {
 public:
  Svg(double width, double height, const std::string& css_class, const std::string& label);
  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& extra = "");
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, const std::string& extra = "");
  void text(double x, double y, std::string_view content, const std::string& extra = "");
  void path(const std::string& d, const std::string& fill, const std::string& extra = "");
  // <g ...><title>tip</title> ... end_group(); an empty tip adds no title.
  void begin_group(const std::string& attrs, std::string_view tip = {});
  void end_group();
  void title(std::string_view tip);
  // Horizontal grid lines and labels for a bytes axis: value v at y(v) = y0 - v * scale.
  void bytes_axis(double x_left, double x_right, double y0, double scale, const std::vector<double>& ticks);
  // Tick marks and ms labels under the horizontal line at height y: t at x0 + (t - t0) * scale.
  void time_axis(double x0, double t0, double scale, double y, const std::vector<double>& ticks);
  std::string str() const;  // the element, closed

 private:
  std::string out_;
  int open_groups_ = 0;
};

// The HTML legend of the eight categories (swatch and name), or of the actions F/B/W
// and the bubble.
std::string category_legend();
std::string action_legend();

}  // namespace shardscope::html
