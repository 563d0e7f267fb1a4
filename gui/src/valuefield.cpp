#include "valuefield.h"

#include <cmath>
#include <limits>

#include <QLocale>

namespace distplan::gui {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int decimalShift(FieldUnit unit) {
  switch (unit) {
    case FieldUnit::tera:
      return 12;
    case FieldUnit::giga:
      return 9;
    default:
      return 0;
  }
}

/// Shortest text that reads back as `v` (Qt's round-trip formatting).
QString shortest(double v) {
  return QString::number(v, 'g', QLocale::FloatingPointShortest);
}

}  // namespace

QString shiftDecimal(const QString& number, int k) {
  // value = digits × 10^exp10, then exp10 -= k: exact, whatever the magnitude.
  QString s = number.trimmed();
  QString sign;
  if (s.startsWith(QLatin1Char('-')) || s.startsWith(QLatin1Char('+'))) {
    if (s[0] == QLatin1Char('-')) sign = QStringLiteral("-");
    s = s.mid(1);
  }
  long long exp10 = 0;
  const qsizetype e = s.indexOf(QLatin1Char('e'), 0, Qt::CaseInsensitive);
  if (e >= 0) {
    bool ok = false;
    exp10 = s.mid(e + 1).toLongLong(&ok);
    if (!ok) return {};
    s = s.left(e);
  }
  QString digits = s;
  const qsizetype dot = s.indexOf(QLatin1Char('.'));
  if (dot >= 0) {
    digits = s.left(dot) + s.mid(dot + 1);
    exp10 -= s.size() - dot - 1;
  }
  for (QChar c : digits) {
    if (!c.isDigit()) return {};
  }
  while (digits.startsWith(QLatin1Char('0'))) digits.remove(0, 1);
  if (digits.isEmpty()) return QStringLiteral("0");
  while (digits.endsWith(QLatin1Char('0'))) {
    digits.chop(1);
    ++exp10;
  }
  exp10 -= k;
  const long long n = digits.size();
  const long long point = n + exp10;  // position of the decimal point from the left
  if (exp10 >= 0 && point <= 21) return sign + digits + QString(exp10, QLatin1Char('0'));
  if (point > 0 && point < n)
    return sign + digits.left(point) + QLatin1Char('.') + digits.mid(point);
  if (point <= 0 && point > -6) {
    return sign + QStringLiteral("0.") + QString(-point, QLatin1Char('0')) + digits;
  }
  QString mantissa = digits.left(1);
  if (n > 1) mantissa += QLatin1Char('.') + digits.mid(1);
  return sign + mantissa + QLatin1Char('e') + QString::number(point - 1);
}

ValueField::ValueField(FieldUnit unit, QWidget* parent) : QLineEdit(parent), unit_(unit) {
  setMaxLength(1 << 24);  // the input bound is 16 MiB; Qt's default is 32767 characters
  connect(this, &QLineEdit::editingFinished, this, &ValueField::commit);
}

QString ValueField::textForValue(const nlohmann::json& v) const {
  if (v.is_null()) return {};
  if (v.is_string()) return QString::fromStdString(v.get<std::string>());
  if (!v.is_number()) return QString::fromStdString(v.dump());
  const QString text = QString::fromStdString(v.dump());
  switch (unit_) {
    case FieldUnit::plain:
      return text;
    case FieldUnit::tera:
    case FieldUnit::giga:
      return shiftDecimal(text, decimalShift(unit_));
    case FieldUnit::giB: {
      // Division by 2^30 is exact in binary; whole bytes above 2^53 are shown as bytes.
      if (v.is_number_integer()) {
        const auto bytes = v.get<long long>();
        if (std::llabs(bytes) > (1LL << 53)) return text + tr(" B");
        return shortest(static_cast<double>(bytes) / kGiB);
      }
      return shortest(v.get<double>() / kGiB);
    }
  }
  return text;
}

nlohmann::json ValueField::valueForText(const QString& raw) const {
  const QString text = raw.trimmed();
  if (text.isEmpty()) return nullptr;
  if (unit_ == FieldUnit::giB && text.endsWith(QStringLiteral(" B"))) {  // whole bytes
    const nlohmann::json bytes =
        nlohmann::json::parse(text.chopped(2).toStdString(), nullptr, false);
    return bytes.is_number() ? bytes : nlohmann::json(text.toStdString());
  }
  const nlohmann::json parsed = nlohmann::json::parse(text.toStdString(), nullptr, false);
  if (!parsed.is_number() && !parsed.is_boolean() && !parsed.is_array()) {
    return text.toStdString();  // not a number: the validator names the field
  }
  if (!parsed.is_number() || unit_ == FieldUnit::plain) return parsed;
  if (unit_ == FieldUnit::giB) {
    const double bytes = parsed.get<double>() * kGiB;
    if (!std::isfinite(bytes) || std::abs(bytes) > 9.0e18) return text.toStdString();
    return static_cast<long long>(std::llround(bytes));
  }
  // 10^k units: shift the typed decimal text, then read it as a number (exact decimal scaling).
  const QString scaled = shiftDecimal(text, -decimalShift(unit_));
  const nlohmann::json value = nlohmann::json::parse(scaled.toStdString(), nullptr, false);
  return value.is_number() ? value : nlohmann::json(text.toStdString());
}

void ValueField::showValue(const nlohmann::json& value, bool inDocument) {
  // A refresh (a plan arriving from the worker) never overwrites what the person is typing.
  if (hasFocus() && isModified() && text() != shown_) return;
  shown_ = textForValue(value);
  inDocument_ = inDocument;
  QFont f = font();
  f.setItalic(!inDocument);
  setFont(f);
  setToolTip(inDocument ? QString()
                        : tr("Not in the file: the preset's or the default value, shown as is"));
  const QSignalBlocker block(this);
  setText(shown_);
  // What the line edit holds (it truncates past its maximum length): leaving the field without
  // typing then never writes a shortened value.
  shown_ = text();
  setCursorPosition(0);
}

void ValueField::commit() {
  if (text() == shown_) return;  // nothing typed: the document keeps its value, byte for byte
  const nlohmann::json value = valueForText(text());
  shown_ = text();
  inDocument_ = !value.is_null();
  emit valueEdited(value);
}

}  // namespace distplan::gui
