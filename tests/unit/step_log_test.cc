#include "omni/step_log.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace omni {
namespace {

namespace fs = std::filesystem;
using testing::MakeStep;

std::string TempPath(const std::string& name) {
  return (fs::temp_directory_path() / (name + "." + std::to_string(::getpid()))).string();
}

// A log with the default header, then `text` appended as it is.
void WriteHeaderThen(const std::string& path, const std::string& text) {
  StepLogHeader h;
  auto w = StepLogWriter::Open(path, h);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Close().ok());
  std::ofstream out(path, std::ios::app);
  out << text;
}

TEST(StepLog, RoundTripsHeaderEventsPhasesAndSpans) {
  const std::string path = TempPath("steplog_roundtrip.jsonl");
  StepLogHeader h;
  h.source = "test";
  h.checkpoint = PeriodicEvent{50, 49, 123};
  h.eval.every_ns = 30'000'000'000;  // by wall time
  h.eval.wall_lag_steps = 1;
  h.pipeline = PipelineSchedule{4, 8, 2, 1.5};
  PhaseCatalog cat = h.phases;
  auto w = StepLogWriter::Open(path, h);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Append(MakeStep(0, 0, 100, {{phase::kCompute, 0, 50}}), cat, true).ok());
  const PhaseId user = *cat.Register("late_phase", IdleKind::kHostSide);
  ASSERT_TRUE(
      (*w)->Append(MakeStep(1, 100, 100, {{phase::kCompute, 0, 50}, {user, 10, 20, 1}}), cat, false)
          .ok());
  ASSERT_TRUE((*w)->Close().ok());
  auto log = ReadStepLog(path);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->header.source, "test");
  EXPECT_EQ(log->header.checkpoint.every_steps, 50);
  EXPECT_EQ(log->header.checkpoint.expected_ns, 123);
  EXPECT_EQ(log->header.checkpoint.every_ns, 0);
  EXPECT_EQ(log->header.eval.every_ns, 30'000'000'000);
  EXPECT_EQ(log->header.eval.wall_lag_steps, 1);
  EXPECT_EQ(log->header.checkpoint.wall_lag_steps, 0);
  EXPECT_EQ(log->header.eval.every_steps, 0);
  EXPECT_EQ(log->header.pipeline.stages, 4);
  EXPECT_DOUBLE_EQ(log->header.pipeline.backward_over_forward, 1.5);
  ASSERT_EQ(log->steps.size(), 2u);
  EXPECT_EQ(log->header.phases.idle_kind(user), IdleKind::kHostSide);
  EXPECT_EQ(log->steps[1].spans[1].phase, user);
  EXPECT_EQ(log->steps[1].spans[1].start_ns, 110'000'000);
  fs::remove(path);
}

TEST(StepLog, ReportsMalformedLinesWithFileAndLine) {
  const std::string path = TempPath("steplog_bad.jsonl");
  WriteHeaderThen(path,
                  "{\"type\":\"step\",\"step\":0,\"start_ns\":0,\"end_ns\":10,\"spans\":[]}\n"
                  "this is not json\n");
  auto log = ReadStepLog(path);
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.status().message().find(path + ":3"), absl::string_view::npos) << log.status();
  fs::remove(path);
}

// A log without its header line (written by hand, or converted from
// another tool's trace) is read with the built-in phases and no declared
// events; a phase outside them is refused by name, as is a first line that
// is neither a header nor a step.
TEST(StepLog, ALogWithoutAHeaderIsReadWithTheBuiltInPhases) {
  const std::string path = TempPath("steplog_noheader.jsonl");
  {
    std::ofstream out(path);
    out << "{\"type\":\"step\",\"step\":0,\"start_ns\":0,\"end_ns\":100,\"spans\":["
           "{\"phase\":\"data_wait\",\"start_ns\":0,\"end_ns\":20,\"depth\":0},"
           "{\"phase\":\"compute\",\"start_ns\":20,\"end_ns\":100,\"depth\":0}]}\n"
           "{\"type\":\"step\",\"step\":1,\"start_ns\":100,\"end_ns\":200,\"spans\":["
           "{\"phase\":\"eval\",\"start_ns\":100,\"end_ns\":200,\"depth\":0}]}\n";
  }
  auto log = ReadStepLog(path);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_EQ(log->steps.size(), 2u);
  EXPECT_EQ(log->steps[0].spans[0].phase, phase::kDataWait);
  EXPECT_EQ(log->steps[1].kind(), StepKind::kEval);
  EXPECT_EQ(log->header.eval.every_steps, 0);
  {
    std::ofstream out(path);
    out << "{\"type\":\"step\",\"step\":0,\"start_ns\":0,\"end_ns\":100,\"spans\":["
           "{\"phase\":\"prefetch\",\"start_ns\":0,\"end_ns\":20,\"depth\":0}]}\n";
  }
  log = ReadStepLog(path);
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.status().message().find("prefetch"), absl::string_view::npos) << log.status();
  {
    std::ofstream out(path);
    out << "{\"type\":\"metrics\",\"loss\":0.5}\n";
  }
  log = ReadStepLog(path);
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.status().message().find("neither an omni.steplog header nor a step"),
            absl::string_view::npos)
      << log.status();
  fs::remove(path);
}

// A running job's log read while its writer is mid-line (or the log of a
// writer killed mid-line): the steps before are read, the unfinished line is
// left out and counted. The same bytes followed by a newline are a malformed
// line, and a complete last step without its newline is read.
TEST(StepLog, AnUnfinishedLastLineIsLeftOutAndCountedNotAnError) {
  const std::string path = TempPath("steplog_live.jsonl");
  const std::string step0 =
      "{\"type\":\"step\",\"step\":0,\"start_ns\":0,\"end_ns\":10,\"spans\":[]}";
  const std::string step1 =
      "{\"type\":\"step\",\"step\":1,\"start_ns\":10,\"end_ns\":20,\"spans\":[]}";
  const auto write = [&](const std::string& tail) { WriteHeaderThen(path, step0 + "\n" + tail); };
  write(step1.substr(0, 30));
  auto log = ReadStepLog(path);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->steps.size(), 1u);
  EXPECT_EQ(log->unfinished_tail_bytes, 30u);
  write(step1.substr(0, 30) + "\n");
  log = ReadStepLog(path);
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.status().message().find(path + ":3: not a JSON object"), absl::string_view::npos)
      << log.status();
  write(step1);
  log = ReadStepLog(path);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->steps.size(), 2u);
  EXPECT_EQ(log->unfinished_tail_bytes, 0u);
  fs::remove(path);
}

// Two runs in one file (appended by hand, or from two hosts): the second's
// clock starts anew. Read on, every forecast would be scored against time
// out of order (omni eval reported recall 0 and no window at all).
TEST(StepLog, AClockThatGoesBackIsRefusedNamingTheLineAndBothSteps) {
  const std::string path = TempPath("steplog_clock_back.jsonl");
  WriteHeaderThen(path,
                  "{\"type\":\"step\",\"step\":7,\"start_ns\":5000,\"end_ns\":6000,\"spans\":[]}\n"
                  "{\"type\":\"step\",\"step\":8,\"start_ns\":100,\"end_ns\":900,\"spans\":[]}\n");
  auto log = ReadStepLog(path);
  ASSERT_FALSE(log.ok());
  EXPECT_EQ(log.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(log.status().message().find(path + ":3: step 8 starts at 100 ns, before step 7"),
            absl::string_view::npos)
      << log.status();
  fs::remove(path);
}

TEST(StepLog, ASecondRunAppendedToTheFirstIsRefusedSayingSoAndWhereToSplit) {
  // A resumed run that redoes steps 8.. after its predecessor reached 9.
  const std::string path = TempPath("steplog_two_runs.jsonl");
  WriteHeaderThen(
      path,
      "{\"type\":\"step\",\"step\":8,\"start_ns\":1000,\"end_ns\":2000,\"spans\":[]}\n"
      "{\"type\":\"step\",\"step\":9,\"start_ns\":2000,\"end_ns\":3000,\"spans\":[]}\n"
      "{\"type\":\"step\",\"step\":8,\"start_ns\":9000,\"end_ns\":9900,\"spans\":[]}\n");
  auto log = ReadStepLog(path);
  ASSERT_FALSE(log.ok());
  EXPECT_EQ(log.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(log.status().message());
  EXPECT_NE(m.find(path + ":4: step 8 is not after step 9 although it started later: two runs"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("split the file before this line"), std::string::npos) << m;
  fs::remove(path);
}

TEST(StepLog, RefusesSpansThatDoNotNest) {
  const std::string path = TempPath("steplog_nest.jsonl");
  {
    StepLogHeader h;
    ASSERT_TRUE(StepLogWriter::Open(path, h).ok());
    std::ofstream out(path, std::ios::app);
    out << R"({"type":"step","step":0,"start_ns":0,"end_ns":100,"spans":[)"
        << R"({"phase":"compute","start_ns":0,"end_ns":60,"depth":0},)"
        << R"({"phase":"optimizer","start_ns":50,"end_ns":90,"depth":0}]})"
        << "\n";
  }
  auto log = ReadStepLog(path);
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.status().message().find("overlaps"), absl::string_view::npos) << log.status();
  fs::remove(path);
}

TEST(StepLog, RefusesANewerSchemaVersionAndMissingFiles) {
  const std::string path = TempPath("steplog_newer.jsonl");
  {
    std::ofstream out(path);
    out << R"({"type":"header","schema":"omni.steplog","version":7,"phases":[]})"
        << "\n";
  }
  EXPECT_EQ(ReadStepLog(path).status().code(), absl::StatusCode::kFailedPrecondition);
  fs::remove(path);
  auto missing = ReadStepLog("/nonexistent/steps.jsonl");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/steps.jsonl"), absl::string_view::npos);
}

// A header line the reader accepts (built-in phases only).
std::string HeaderLine() {
  const std::string path = TempPath("steplog_header.jsonl");
  {
    auto w = StepLogWriter::Open(path, StepLogHeader{});
    EXPECT_TRUE(w.ok());
    EXPECT_TRUE((*w)->Close().ok());
  }
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  fs::remove(path);
  return line;
}

TEST(StepLog, TypeConfusionIsAnErrorNamingFileAndLineNotAnException) {
  const std::string path = TempPath("steplog_types.jsonl");
  const std::string header = HeaderLine();
  const std::vector<std::string> bad_steps = {
      R"({"type":5,"step":0,"start_ns":0,"end_ns":10,"spans":[]})",
      R"({"type":"step","step":0,"start_ns":0,"end_ns":10,"spans":[1]})",
      R"({"type":"step","step":"zero","start_ns":0,"end_ns":10,"spans":[]})",
      R"({"type":"step","step":0,"start_ns":0,"end_ns":10,"spans":[{"phase":3,"start_ns":0,"end_ns":1,"depth":0}]})",
      R"({"type":"step","step":0,"start_ns":0,"end_ns":10,"spans":[],"spans_truncated":"yes"})",
      R"({"type":"phase","id":"x","name":"a","idle":"busy"})",
      R"([1,2,3])",
  };
  for (const std::string& bad : bad_steps) {
    {
      std::ofstream out(path, std::ios::trunc);
      out << header << "\n" << bad << "\n";
    }
    absl::StatusOr<StepLog> log;
    ASSERT_NO_THROW(log = ReadStepLog(path)) << bad;
    ASSERT_FALSE(log.ok()) << bad;
    EXPECT_EQ(log.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(log.status().message().find(path + ":2"), absl::string_view::npos)
        << bad << " -> " << log.status();
  }
  const std::vector<std::string> bad_headers = {
      R"({"type":"header","schema":"omni.steplog","version":1,"phases":[],"source":7})",
      R"({"type":"header","schema":"omni.steplog","version":1,"phases":[],"events":[1]})",
      R"({"type":"header","schema":"omni.steplog","version":1,"phases":[],"events":{"pipeline":{"stages":"two"}}})",
      R"({"type":"header","schema":5,"version":1,"phases":[]})",
  };
  for (const std::string& bad : bad_headers) {
    {
      std::ofstream out(path, std::ios::trunc);
      out << bad << "\n";
    }
    absl::StatusOr<StepLog> log;
    ASSERT_NO_THROW(log = ReadStepLog(path)) << bad;
    ASSERT_FALSE(log.ok()) << bad;
    EXPECT_NE(log.status().message().find(path + ":1"), absl::string_view::npos)
        << bad << " -> " << log.status();
  }
  fs::remove(path);
}

TEST(StepLog, LinesOverTheLimitAreRefusedNamingFileAndLine) {
  const std::string path = TempPath("steplog_long.jsonl");
  {
    std::ofstream out(path);
    out << HeaderLine() << "\n";
    out << R"({"type":"note","pad":")" << std::string(kMaxStepLogLineBytes + 1, 'x') << "\"}\n";
  }
  auto log = ReadStepLog(path);
  ASSERT_FALSE(log.ok());
  EXPECT_EQ(log.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(log.status().message().find(path + ":2"), absl::string_view::npos) << log.status();
  EXPECT_NE(log.status().message().find("limit"), absl::string_view::npos) << log.status();
  fs::remove(path);
}

// In a child bounded by alarm(): a reader that blocks is killed, and the
// test fails instead of hanging.
TEST(StepLog, AFifoIsRefusedWithoutBlocking) {
  const std::string path = TempPath("steplog_fifo.jsonl");
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(10);
    auto log = ReadStepLog(path);
    const bool good = !log.ok() && log.status().code() == absl::StatusCode::kFailedPrecondition &&
                      log.status().message().find(path) != absl::string_view::npos;
    ::_exit(good ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  fs::remove(path);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << (WIFSIGNALED(status) ? "the reader blocked (killed by the alarm)" : "wrong error");
}

// A resumed job learns from the end of its previous run's log, which may be
// gigabytes: the tail is read without what lies between it and the head.
TEST(StepLogTail, ReadsTheHeaderTheEarlyPhasesAndTheLastStepsAsTheWholeReadHasThem) {
  const std::string path = TempPath("steplog_tail.jsonl");
  StepLogHeader h;
  h.source = "tail";
  h.eval = PeriodicEvent{40, 39, 0};
  PhaseCatalog cat = h.phases;
  auto w = StepLogWriter::Open(path, h);
  ASSERT_TRUE(w.ok()) << w.status();
  const PhaseId fetch = *cat.Register("fetch", IdleKind::kDataStall);  // before the first step
  // Steps of ~400 bytes: 3,000 of them span many of the reader's 64 KiB chunks.
  for (int s = 0; s < 3000; ++s) {
    ASSERT_TRUE((*w)->Append(MakeStep(s, 10 * s, 9,
                                      {{fetch, 0, s % 3 == 0 ? 4 : 1}, {phase::kCompute, 4, 5}}),
                             cat, false)
                    .ok());
  }
  ASSERT_TRUE((*w)->Close().ok());
  absl::StatusOr<StepLog> whole = ReadStepLog(path);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (const int n : {1, 7, 500, 2999, 3000, 5000}) {
    SCOPED_TRACE(n);
    absl::StatusOr<StepLog> tail = ReadStepLogTail(path, n);
    ASSERT_TRUE(tail.ok()) << tail.status();
    EXPECT_EQ(tail->header.source, "tail");
    EXPECT_EQ(tail->header.eval.every_steps, 40);
    ASSERT_TRUE(tail->header.phases.Find("fetch").ok());
    const size_t want = std::min<size_t>(n, 3000);
    ASSERT_EQ(tail->steps.size(), want);
    for (size_t i = 0; i < want; ++i) {
      const StepRecord& a = tail->steps[i];
      const StepRecord& b = whole->steps[3000 - want + i];
      ASSERT_EQ(a.step, b.step);
      ASSERT_EQ(a.start_ns, b.start_ns);
      ASSERT_EQ(a.num_spans, b.num_spans);
      ASSERT_EQ(a.spans[0].end_ns, b.spans[0].end_ns);
    }
  }
  EXPECT_FALSE(ReadStepLogTail(path, 0).ok());
  fs::remove(path);
}

TEST(StepLogTail, LeavesOutAnUnfinishedLastLineAndRefusesAPhaseItDidNotRead) {
  const std::string path = TempPath("steplog_tail_live.jsonl");
  const auto step = [](int s, const char* phase) {
    return "{\"type\":\"step\",\"step\":" + std::to_string(s) +
           ",\"start_ns\":" + std::to_string(10 * s) + ",\"end_ns\":" + std::to_string(10 * s + 9) +
           ",\"spans\":[{\"phase\":\"" + phase + "\",\"start_ns\":" + std::to_string(10 * s) +
           ",\"end_ns\":" + std::to_string(10 * s + 5) + ",\"depth\":0}]}\n";
  };
  std::string body;
  for (int s = 0; s < 10; ++s) body += step(s, "compute");
  WriteHeaderThen(path, body + step(10, "compute").substr(0, 25));
  absl::StatusOr<StepLog> tail = ReadStepLogTail(path, 3);
  ASSERT_TRUE(tail.ok()) << tail.status();
  ASSERT_EQ(tail->steps.size(), 3u);
  EXPECT_EQ(tail->steps.back().step, 9);
  EXPECT_EQ(tail->unfinished_tail_bytes, 25u);
  // A phase registered after the first step: its line is not in the tail.
  WriteHeaderThen(path, body +
                            "{\"type\":\"phase\",\"id\":" + std::to_string(PhaseCatalog().size()) +
                            ",\"name\":\"late\",\"idle\":\"host_side\"}\n" + step(10, "late") +
                            step(11, "late"));
  tail = ReadStepLogTail(path, 2);
  ASSERT_FALSE(tail.ok());
  EXPECT_NE(tail.status().message().find("late"), absl::string_view::npos) << tail.status();
  EXPECT_NE(tail.status().message().find(path + ": line at byte"), absl::string_view::npos)
      << tail.status();
  EXPECT_TRUE(ReadStepLogTail(path, 3).ok());  // the phase line is in a tail of 3 lines
  fs::remove(path);
}

// A crash can leave a file's end filled with zeros (the size was written,
// the data was not): the tail reader refuses the stretch as soon as it has
// read more of it than a line may hold, not after reading the whole file.
TEST(StepLogTail, AnEndFilledWithZerosIsRefusedAfterReadingALinesWorth) {
  const std::string path = TempPath("steplog_tail_zeros.jsonl");
  std::string body;
  for (int s = 0; s < 10; ++s) {
    body += "{\"type\":\"step\",\"step\":" + std::to_string(s) +
            ",\"start_ns\":" + std::to_string(10 * s) +
            ",\"end_ns\":" + std::to_string(10 * s + 9) + ",\"spans\":[]}\n";
  }
  WriteHeaderThen(path, body + std::string(3 * kMaxStepLogLineBytes, '\0'));
  absl::StatusOr<StepLog> tail = ReadStepLogTail(path, 5);
  ASSERT_FALSE(tail.ok());
  EXPECT_EQ(tail.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tail.status().message().find("longer than the limit"), absl::string_view::npos)
      << tail.status();
  // Zeros up to a line's worth are an unfinished last line.
  WriteHeaderThen(path, body + std::string(1000, '\0'));
  tail = ReadStepLogTail(path, 5);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(tail->steps.size(), 5u);
  EXPECT_EQ(tail->unfinished_tail_bytes, 1000u);
  fs::remove(path);
}

TEST(PreviousRunSteps, TheStepsBeforeTheFirstRenamedAndEndingOneUsualGapBeforeIt) {
  StepLog previous;
  const PhaseId fetch = *previous.header.phases.Register("fetch", IdleKind::kDataStall);
  // Steps of 8 ms every 10 ms, from 1,000 s on a clock of another boot.
  for (int s = 0; s < 10; ++s) {
    previous.steps.push_back(
        MakeStep(s, 1'000'000 + 10 * s, 8, {{fetch, 0, 3}, {phase::kCompute, 3, 8}}));
  }
  PhaseCatalog now;
  const PhaseId other = *now.Register("other", IdleKind::kHostSide);
  const PhaseId fetch_now = *now.Register("fetch", IdleKind::kDataStall);
  ASSERT_NE(fetch_now, fetch);
  // Resumed from a checkpoint of step 5 (6-9 are redone), at 45 ms.
  const StepRecord first = MakeStep(6, 45, 8, {});
  absl::StatusOr<std::vector<StepRecord>> got = PreviousRunSteps(previous, first, now, 100);
  ASSERT_TRUE(got.ok()) << got.status();
  // 0-5, less those the move puts before the clock's 0: step 5 ends 2 ms
  // (the usual gap) before 45 ms, so step 1 starts at -5 ms.
  ASSERT_EQ(got->size(), 4u);
  EXPECT_EQ(got->front().step, 2);
  EXPECT_EQ(got->front().start_ns, 5'000'000);
  EXPECT_EQ(got->back().step, 5);
  EXPECT_EQ(got->back().end_ns, 43'000'000);
  EXPECT_EQ(got->back().start_ns, 35'000'000);
  EXPECT_EQ(got->back().spans[0].phase, fetch_now);
  EXPECT_EQ(got->back().spans[0].start_ns, 35'000'000);
  EXPECT_EQ(got->back().spans[1].phase, phase::kCompute);
  EXPECT_TRUE(ValidateStepRecord(got->back(), now).ok());
  // At most max_steps, the last ones.
  got = PreviousRunSteps(previous, first, now, 2);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ(got->front().step, 4);
  // A fresh start (step 0 first): nothing before it.
  got = PreviousRunSteps(previous, MakeStep(0, 45, 8, {}), now, 100);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());
  // Another job's phases: nothing, and the phase named.
  PhaseCatalog lacking;
  got = PreviousRunSteps(previous, first, lacking, 100);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("'fetch' is not registered"), absl::string_view::npos);
  PhaseCatalog changed;
  ASSERT_TRUE(changed.Register("fetch", IdleKind::kHostSide).ok());
  got = PreviousRunSteps(previous, first, changed, 100);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  // A log built in code with a span of a phase it never registered.
  StepLog built = previous;
  built.steps[4].spans[0].phase = static_cast<PhaseId>(previous.header.phases.size());
  got = PreviousRunSteps(built, first, now, 100);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  (void)other;
}

}  // namespace
}  // namespace omni
