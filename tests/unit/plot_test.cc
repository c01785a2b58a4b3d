#include "plot.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "omni/evaluator.h"
#include "svg.h"
#include "test_util.h"

namespace omni {
namespace {

using testing::MakeStep;

// 80 steps of 100 ms: a 20 ms data wait, then compute; every 10th step has a
// 50 ms eval instead of part of its compute.
StepLog SyntheticLog() {
  StepLog log;
  log.header.source = "plot_test";
  log.header.eval.every_steps = 10;
  log.header.eval.offset = 9;
  for (int64_t s = 0; s < 80; ++s) {
    if (s % 10 == 9) {
      log.steps.push_back(MakeStep(
          s, 1000 + s * 100, 100,
          {{phase::kDataWait, 0, 20}, {phase::kEval, 20, 70}, {phase::kCompute, 70, 100}}));
    } else {
      log.steps.push_back(MakeStep(s, 1000 + s * 100, 100,
                                   {{phase::kDataWait, 0, 20}, {phase::kCompute, 20, 100}}));
    }
  }
  return log;
}

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(PlotTimeline, DrawsOneRealBarPerIdleIntervalAndLaneScoresMatchOmniEval) {
  const StepLog log = SyntheticLog();
  cli::PlotOptions o;
  auto svg = cli::PlotTimeline(log, o);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(svg->rfind("<?xml", 0), 0u);
  EXPECT_NE(svg->find("</svg>"), std::string::npos);
  EXPECT_EQ(Count(*svg, "<title>real data_stall"), 80);
  EXPECT_EQ(Count(*svg, "<title>real eval"), 8);
  EXPECT_GT(Count(*svg, "<title>forecast data_stall"), 0);
  EXPECT_EQ(Count(*svg, "<title>step "), 80);

  EvaluateOptions eo;
  auto rep = Evaluate(log, eo);
  ASSERT_TRUE(rep.ok()) << rep.status();
  for (const IdleKind k : {IdleKind::kDataStall, IdleKind::kEval}) {
    const std::regex lane(
        std::string(IdleKindName(k)) +
        " real</text>\n.*\n<text[^>]*>precision ([0-9.-]+) recall ([0-9.-]+)</text>");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(*svg, m, lane)) << IdleKindName(k);
    const auto& s = rep->by_kind[static_cast<int>(k)];
    const auto fmt = [](double v) {
      return std::isnan(v) ? std::string("-") : absl::StrFormat("%.2f", v);
    };
    EXPECT_EQ(m[1].str(), fmt(s.precision())) << IdleKindName(k);
    EXPECT_EQ(m[2].str(), fmt(s.recall())) << IdleKindName(k);
  }
}

TEST(PlotTimeline, ShowsOnlyTheRequestedStepsAndRefusesAnEmptyRange) {
  const StepLog log = SyntheticLog();
  cli::PlotOptions o;
  o.from_step = 30;
  o.to_step = 39;
  auto svg = cli::PlotTimeline(log, o);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(Count(*svg, "<title>step "), 10);
  EXPECT_EQ(Count(*svg, "<title>real eval"), 1);
  o.from_step = 500;
  o.to_step = 600;
  EXPECT_EQ(cli::PlotTimeline(log, o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cli::PlotTimeline(StepLog{}, cli::PlotOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlotCommand, AFlagValueOutsideItsRangeIsRefusedNamingTheFlag) {
  // The values were converted from a double unchecked: a step number past
  // the int64 range was undefined (--from-step 9223372036854775807 plotted
  // the whole log), and --window 1e10 or --horizon-s 1e30 likewise.
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, std::string>>{{"--from-step", "9223372036854775807"},
                                                        {"--to-step", "-1"},
                                                        {"--from-step", "2.5"},
                                                        {"--window", "1e10"},
                                                        {"--horizon-s", "1e30"},
                                                        {"--width", "0"},
                                                        {"--k", "nan"}}) {
    std::vector<std::string> args = {"omni", "plot", "no-such.jsonl", flag, value};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    ::testing::internal::CaptureStderr();
    const int rc = cli::PlotCommand(static_cast<int>(argv.size()), argv.data());
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(rc, 2) << flag << " " << value << ": " << err;
    EXPECT_NE(err.find(flag), std::string::npos) << err;
    EXPECT_NE(err.find(value), std::string::npos) << err;
  }
}

TEST(SvgWriter, EscapesTextAndAttributes) {
  EXPECT_EQ(cli::SvgWriter::Escape("a<b & \"c\" 'd'>"),
            "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;");
  cli::SvgWriter w(10, 10);
  w.Text(1, 2, "x<y");
  EXPECT_NE(w.Finish().find(">x&lt;y</text>"), std::string::npos);
}

TEST(PlotTimeline, DrawsTheGuestsUnitsInTheirOwnLaneAndItsMarksAcrossTheLanes) {
  const StepLog log = SyntheticLog();
  const std::string path = ::testing::TempDir() + "/plot_guest.jsonl";
  {
    std::ofstream f(path);
    // Two units inside the run, one after it (not drawn), a mark, a line of
    // another shape (skipped).
    f << "{\"step\":0,\"start_ns\":2000000000,\"end_ns\":2005000000}\n"
      << "{\"step\":1,\"start_ns\":2005000000,\"end_ns\":2010000000}\n"
      << "{\"step\":2,\"start_ns\":99000000000,\"end_ns\":99005000000}\n"
      << "{\"t_ns\":3000000000,\"mark\":\"r1 killed\"}\n"
      << "{\"other\":1}\n";
  }
  auto track = cli::ReadGuestTrack(path);
  ASSERT_TRUE(track.ok()) << track.status();
  EXPECT_EQ(track->units.size(), 3u);
  ASSERT_EQ(track->marks.size(), 1u);
  cli::PlotOptions o;
  o.guest = *track;
  o.guest.label = "guest steps";
  auto svg = cli::PlotTimeline(log, o);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(Count(*svg, "<title>guest unit"), 2);
  EXPECT_EQ(Count(*svg, ">guest steps</text>"), 1);
  EXPECT_EQ(Count(*svg, ">r1 killed</text>"), 1);
  EXPECT_EQ(Count(*svg, "0.010 s of work"), 1);
}

TEST(PlotTimeline, AMalformedGuestFileIsRefusedNamingFileAndLine) {
  const std::string path = ::testing::TempDir() + "/plot_guest_bad.jsonl";
  {
    std::ofstream f(path);
    f << "{\"start_ns\":1,\"end_ns\":2}\n{not json\n";
  }
  auto track = cli::ReadGuestTrack(path);
  ASSERT_EQ(track.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(track.status().message().find(path + ":2"), std::string::npos) << track.status();
  EXPECT_EQ(cli::ReadGuestTrack(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace omni
