// A minimal SVG writer for the CLI's pictures (no dependency beyond the
// standard library): rectangles, lines and text in user units (pixels).
//
// Thread safety: an SvgWriter is used by one thread at a time.
#pragma once

#include <string>
#include <string_view>

namespace omni::cli {

class SvgWriter {
 public:
  SvgWriter(double width, double height);

  // `fill` and `stroke` are SVG colours ("#4c78a8", "none"); `tooltip`, when
  // not empty, becomes a <title> child (shown on hover by browsers).
  void Rect(double x, double y, double w, double h, std::string_view fill, double opacity = 1.0,
            std::string_view stroke = "none", std::string_view tooltip = "");
  void Line(double x1, double y1, double x2, double y2, std::string_view stroke,
            double stroke_width = 1.0);
  // anchor: "start", "middle" or "end".
  void Text(double x, double y, std::string_view text, double size = 12,
            std::string_view anchor = "start", std::string_view fill = "#222");

  // The complete document.
  std::string Finish() const;

  // `s` with &, <, >, " and ' escaped for XML text and attributes.
  static std::string Escape(std::string_view s);

 private:
  double width_, height_;
  std::string body_;
};

}  // namespace omni::cli
