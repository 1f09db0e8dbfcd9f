#include "apps/cli/progress.h"

#include <string>

namespace troupe::apps {

run_reporter::run_reporter(metrics_log* log, std::FILE* terminal, bool interactive,
                           int64_t steps_per_epoch, int64_t epochs)
    : log_(log),
      terminal_(terminal),
      interactive_(interactive),
      steps_per_epoch_(steps_per_epoch > 0 ? steps_per_epoch : 1),
      epochs_(epochs) {}

void run_reporter::on_step(int64_t step, int64_t total_steps, int64_t epoch, double loss,
                           double samples_per_s) {
  // Exponential smoothing keeps the bar readable when single steps are noisy.
  const double weight = step <= 1 ? 1.0 : 0.05;
  smoothed_loss_ += weight * (loss - smoothed_loss_);
  smoothed_rate_ += weight * (samples_per_s - smoothed_rate_);
  if (monitor_) monitor_->note_step(step, total_steps, epoch, smoothed_rate_);
  if (!interactive_) return;
  const auto now = std::chrono::steady_clock::now();
  if (step < total_steps && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw_bar(step, total_steps, epoch);
}

void run_reporter::draw_bar(int64_t step, int64_t total_steps, int64_t epoch) {
  const int width = 30;
  const int64_t in_epoch = step - epoch * steps_per_epoch_;
  const int filled = static_cast<int>(width * in_epoch / steps_per_epoch_);
  std::string bar(filled, '#');
  bar.resize(width, '.');
  std::fprintf(terminal_, "\r\033[Kepoch %lld/%lld [%s] %lld/%lld  loss %.4f  %.0f samples/s",
               static_cast<long long>(epoch + 1), static_cast<long long>(epochs_), bar.c_str(),
               static_cast<long long>(step), static_cast<long long>(total_steps), smoothed_loss_,
               smoothed_rate_);
  std::fflush(terminal_);
  bar_drawn_ = true;
}

void run_reporter::clear_bar() {
  if (!bar_drawn_) return;
  std::fprintf(terminal_, "\r\033[K");
  bar_drawn_ = false;
}

void run_reporter::on_event(const nlohmann::json& event) {
  if (log_) log_->append(event);
  if (monitor_) monitor_->add_record(event);
  const std::string kind = event.value("event", std::string());
  if (kind == "checkpoint") {
    clear_bar();
    std::fprintf(terminal_, "checkpoint step %lld written to %s (%.1f MB in %.2f s)\n",
                 static_cast<long long>(event.value("step", int64_t{0})),
                 event.value("directory", std::string()).c_str(), event.value("bytes", 0.0) / 1e6,
                 event.value("seconds", 0.0));
  }
}

void run_reporter::on_metrics(const actors::metrics_record& record) {
  const nlohmann::json line = to_json(record);
  if (log_) log_->append(line);
  if (monitor_) monitor_->add_record(line);
  if (record.bits_per_byte) {
    clear_bar();
    std::fprintf(terminal_,
                 "epoch %lld  step %lld  loss %.4f  validation_loss %.4f  bits_per_byte %.4f  "
                 "%.0f tokens/s  %.1f s\n",
                 static_cast<long long>(record.epoch), static_cast<long long>(record.step),
                 record.loss, record.test_loss.value_or(0.0), *record.bits_per_byte,
                 record.tokens_per_s.value_or(0.0), record.wall_s);
  } else if (record.test_accuracy) {
    clear_bar();
    std::fprintf(terminal_,
                 "epoch %lld  step %lld  loss %.4f  test_accuracy %.4f  test_loss %.4f  "
                 "%.0f samples/s  %.1f s\n",
                 static_cast<long long>(record.epoch), static_cast<long long>(record.step),
                 record.loss, *record.test_accuracy, record.test_loss.value_or(0.0),
                 record.samples_per_s, record.wall_s);
  } else if (!interactive_ && record.tokens_per_s) {
    std::fprintf(terminal_, "step %lld  epoch %lld  loss %.4f  lr %.5g  %.0f tokens/s  %.1f s\n",
                 static_cast<long long>(record.step), static_cast<long long>(record.epoch),
                 record.loss, record.learning_rate, *record.tokens_per_s, record.wall_s);
  } else if (!interactive_) {
    std::fprintf(terminal_, "step %lld  epoch %lld  loss %.4f  lr %.5g  %.0f samples/s  %.1f s\n",
                 static_cast<long long>(record.step), static_cast<long long>(record.epoch),
                 record.loss, record.learning_rate, record.samples_per_s, record.wall_s);
  }
  std::fflush(terminal_);
}

}  // namespace troupe::apps
